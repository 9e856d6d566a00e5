/* tensor_map.c: freeing a map (tensor_map.h). */
#include "core/params/tensor_map.h"

#include <stdlib.h>

void ct_tensor_map_free(ct_tensor_map *m) {
    if (!m) return;
    free(m->entries);
    free(m->ignored);
    *m = (ct_tensor_map){0};
}
