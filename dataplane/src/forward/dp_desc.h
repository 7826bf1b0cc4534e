/* dp_desc.h: the dataplane's side of the descriptor check.
 *
 * The check itself, dp_desc_check(), is the one in dp_desc_check.h that the mock
 * dataplane calls too. What is the dataplane's own is how it reads a layer for it:
 * dp_desc_layer_of() takes the view the check reads out of a struct dp_layer that
 * other threads publish. The dispatcher and the fuzz harness call
 *   dp_desc_check(&c->layout, dp_desc_layer_of(l, &view), desc, &limits, &plan, why, n)
 */
#ifndef DP_DESC_H
#define DP_DESC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp_abi.h"
#include "dp_client.h" /* struct dp_client_layout */
#include "dp_desc_check.h"
#include "dp_layers.h"

/* *view filled from l (its ready and failed flags read once, with acquire) and view
 * returned, or NULL when l is NULL (no such layer, or not this client's to use). */
const struct dp_desc_layer *dp_desc_layer_of(const struct dp_layer *l, struct dp_desc_layer *view);

#endif /* DP_DESC_H */
