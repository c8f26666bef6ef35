/* Uploading a model's weights to a device once (weights.c): a place-all function names every
 * tensor with how it is read (weight_use); upload_weights runs it twice, to count the bytes and
 * then to copy each tensor into one allocation, on a backend instance of its own that keeps the
 * memory for as long as the model caches the upload. Used for target models (weights.c) and DFlash
 * drafts (weights_dflash.c). */
#ifndef SPECLA_WEIGHT_UPLOAD_H
#define SPECLA_WEIGHT_UPLOAD_H
#include "backend.h"
#include "specla.h"

/* One pass over every tensor: sums the bytes (memory == NULL) or uploads into `memory`. */
typedef struct upload_pass {
    const backend *be;
    unsigned char *memory; /* NULL: only count */
    size_t offset;
    specla_status status;
    const char *failed;    /* name of the tensor a backend could not take */
} upload_pass;

/* *dev = host, with dev->data at its place in the pass's memory (uploaded for `use`); a tensor
 * without data (an absent optional one) stays as it is. */
void upload_place(upload_pass *pass, const specla_tensor *host, specla_tensor *dev, int use, const char *name);

/* Places every tensor of host_model into the views of device_model (each place-all knows both
 * types). */
typedef void (*upload_place_all_fn)(upload_pass *pass, const void *host_model, void *device_model);

/* Both passes on a new instance of be's kind and device: *owner (the instance) and *memory (the one
 * allocation the views of device_model point into) on success; on failure nothing is left
 * allocated and the message names the tensor. `what` names the model in messages ("model", "draft
 * model"). */
specla_status upload_weights(const backend *be, upload_place_all_fn place_all, const void *host_model,
                             void *device_model, const char *what, backend **owner, void **memory);

#endif
