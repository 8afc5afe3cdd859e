/* The references of moe_route that the moe case files (ops_moe_*.c) share,
 * defined in ops_moe_route.c: the route cases check against them, the
 * moe_matmul cases and the refusals build their plans with moe_ref_plan,
 * and the chain cases route their reference tokens with moe_ref_topk and
 * moe_ref_weights.
 */
#ifndef ATLAS_TESTS_OPS_OPS_MOE_H
#define ATLAS_TESTS_OPS_OPS_MOE_H

#include <stdbool.h>
#include <stdint.h>

/* The top k of a token's E logits by selection: the highest logit not yet
 * taken, the lowest id among equal ones. */
void moe_ref_topk(const float *l, int E, int k, int32_t *ids);
/* ids' softmax probabilities over all E logits in double, divided by their
 * sum when norm. */
void moe_ref_weights(const float *l, int E, const int32_t *ids, int k, bool norm, double *w);
/* The A assignments of ids sorted by expert, stable: order, slot [A],
 * offsets [E + 1]. */
void moe_ref_plan(const int32_t *ids, int A, int E, int32_t *order, int32_t *slot,
		  int32_t *offsets);

#endif
