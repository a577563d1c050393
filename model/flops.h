// model/flops.h: the FLOPs a model's training step does per token, as MFU counts them (the
// same count for `satdar train`'s logged MFU and `satdar plan`'s predicted one).
#ifndef SATDAR_MODEL_FLOPS_H_
#define SATDAR_MODEL_FLOPS_H_

#include <cstdint>

#include "model/config.h"

namespace satdar::model {

// Training FLOPs per token (forward and backward) of the whole model with `parameters`
// elements: 6 per active parameter (the MoE's top_k routed experts, not all of them; the
// SATFormer gate and the depth-retrieval keys are parameters too), 6 x L x T x C for causal
// attention's scores and weighted sums, and 12 x C per history entry a DAR or AttnRes depth
// retrieval reads (a score and a weighted sum per source, per stream).
double FlopsPerToken(int64_t parameters, const ModelConfig& config, int seq_len);

// History entries the depth retrievals of one token read in a forward pass, over every
// retrieval (2L sublayers and the final readout) and stream: 0 for designs without them.
int64_t DepthRetrievalReads(const ModelConfig& config);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_FLOPS_H_
