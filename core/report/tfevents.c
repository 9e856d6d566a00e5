/* tfevents.c: the Event protobufs of TensorBoard scalars (format in tfevents.h); the TFRecord framing
 * around them is core/util/tfrecord.c. */
#include "core/report/tfevents.h"

#include <string.h>
#include <unistd.h>

/* protobuf wire types */
enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

static size_t put_varint(unsigned char *p, uint64_t v) {
    size_t k = 0;
    while (v >= 0x80) {
        p[k++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    p[k++] = (unsigned char)v;
    return k;
}

static size_t put_key(unsigned char *p, unsigned field, unsigned wire) { return put_varint(p, (uint64_t)field << 3 | wire); }

static size_t put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
    return (size_t)bytes;
}

static size_t put_double(unsigned char *p, unsigned field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    size_t k = put_key(p, field, WIRE_FIXED64);
    return k + put_le(p + k, bits, 8);
}

static size_t put_bytes(unsigned char *p, unsigned field, const void *s, size_t n) {
    size_t k = put_key(p, field, WIRE_LEN);
    k += put_varint(p + k, n);
    memcpy(p + k, s, n);
    return k + n;
}

/* wall_time and step, the head of every event */
static size_t put_head(unsigned char *p, double wall_time, int64_t step) {
    size_t k = put_double(p, 1, wall_time);
    k += put_key(p + k, 2, WIRE_VARINT);
    return k + put_varint(p + k, (uint64_t)step); /* int64: negative steps as 10-byte two's complement */
}

size_t ct_tfevent_version(unsigned char buf[CT_TFEVENT_MAX], double wall_time) {
    static const char version[] = "brain.Event:2";
    size_t k = put_head(buf, wall_time, 0);
    return k + put_bytes(buf + k, 3, version, sizeof version - 1);
}

size_t ct_tfevent_scalar(unsigned char buf[CT_TFEVENT_MAX], double wall_time, int64_t step, const char *tag,
                         float value) {
    size_t tag_len = strnlen(tag, CT_TFEVENT_TAG_MAX);
    /* Value, then Summary around it, each built ahead of the lengths that prefix them */
    unsigned char value_msg[CT_TFEVENT_TAG_MAX + 16], summary[CT_TFEVENT_TAG_MAX + 32];
    size_t nv = put_bytes(value_msg, 1, tag, tag_len);
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    nv += put_key(value_msg + nv, 2, WIRE_FIXED32);
    nv += put_le(value_msg + nv, bits, 4);
    size_t ns = put_bytes(summary, 1, value_msg, nv);
    size_t k = put_head(buf, wall_time, step);
    return k + put_bytes(buf + k, 5, summary, ns);
}

void ct_tfevents_filename(char *buf, size_t n, double unix_time) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    snprintf(buf, n, "events.out.tfevents.%010lld.%s.%d.0", (long long)unix_time, host, (int)getpid());
}
