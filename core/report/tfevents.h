/* tfevents.h: TensorBoard event files, encoded by hand (no TensorFlow, no protobuf library).
 *
 * A file is a sequence of TFRecords (framing: core/util/tfrecord.h, ct_tfrecord_write). Each
 * record's data is an Event protobuf:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 * The first event carries file_version "brain.Event:2" (TensorBoard's format check); every later
 * one is a single scalar. */
#ifndef CT_TFEVENTS_H
#define CT_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/util/tfrecord.h" /* ct_tfrecord_write, which the writers call */

/* Room for any event these functions encode (a tag is at most CT_TFEVENT_TAG_MAX bytes). */
#define CT_TFEVENT_TAG_MAX 256
#define CT_TFEVENT_MAX (64 + CT_TFEVENT_TAG_MAX)

/* The file's first event. Returns the encoded length (at most CT_TFEVENT_MAX). */
size_t ct_tfevent_version(unsigned char buf[CT_TFEVENT_MAX], double wall_time);
/* One scalar. A tag longer than CT_TFEVENT_TAG_MAX is cut there. Returns the encoded length. */
size_t ct_tfevent_scalar(unsigned char buf[CT_TFEVENT_MAX], double wall_time, int64_t step, const char *tag,
                         float value);

/* The file name TensorBoard's writers use: events.out.tfevents.<unix seconds, 10 digits>.<host>.
 * <pid>.0 (TensorBoard reads every events.out.tfevents.* file of a directory as one run). */
void ct_tfevents_filename(char *buf, size_t n, double unix_time);

#endif
