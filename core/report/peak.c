/* peak.c: the dense 16-bit tensor-core peak of known GPUs, for MFU (model FLOPs utilisation).
 *
 * MFU = the model's training FLOPs per second / the device's peak, against the bf16/fp16 dense
 * peak whatever the run's dtype, as nanoGPT and llm.c report it, so the numbers compare. Figures
 * are NVIDIA's datasheet values without sparsity. A device that is not in the table (a CPU, an
 * unlisted GPU) has no peak: the run reports no MFU rather than a guess. */
#include <ctype.h>
#include <string.h>

#include "core/report/report.h"

typedef struct {
    const char *name;            /* matched in the device description as a whole word */
    double tflops;
} peak_row;

/* More specific names first: "H100 PCIe" before "H100", "GH200" before "H200". */
static const peak_row peaks[] = {
    {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H100", 989.0},   /* "H100 80GB HBM3" is the SXM part */
    {"GH200", 989.0},     {"H200", 989.0},
    {"A100", 312.0},      {"A800", 312.0},
    {"L40S", 362.0},      {"L4", 121.0},
    {"A10", 125.0},
};

/* `word` occurs in s with no letter or digit right before or after it ("A10" is not in "A100"). */
static bool has_word(const char *s, const char *word) {
    size_t n = strlen(word);
    for (const char *p = strstr(s, word); p; p = strstr(p + 1, word)) {
        bool before = p > s && isalnum((unsigned char)p[-1]);
        bool after = isalnum((unsigned char)p[n]);
        if (!before && !after) return true;
    }
    return false;
}

double ct_device_peak_flops(const char *device_desc) {
    if (!device_desc) return 0.0;
    for (int i = 0; i < CT_ARRAY_LEN(peaks); i++)
        if (has_word(device_desc, peaks[i].name)) return peaks[i].tflops * 1e12;
    return 0.0;
}
