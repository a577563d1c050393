#include "model/flops.h"

namespace satdar::model {

int64_t DepthRetrievalReads(const ModelConfig& c) {
  int streams = 0, default_block = 1;
  if (c.residual == Residual::kAttnRes) {
    streams = 1;
  } else if (c.residual == Residual::kDar) {
    streams = 2;
    default_block = 2;
  } else {
    return 0;
  }
  // Retrieval i (0 before sublayer 1, ..., 2L the final readout) reads the embedding and one
  // entry per block of `block` sublayers begun before it: 1 + ceil(i / block).
  const int64_t block = c.block_size > 0 ? c.block_size : default_block;
  int64_t reads = 0;
  for (int64_t i = 0; i <= 2 * static_cast<int64_t>(c.num_hidden_layers); ++i) {
    reads += 1 + (i + block - 1) / block;
  }
  return reads * streams;
}

double FlopsPerToken(int64_t parameters, const ModelConfig& c, int seq_len) {
  double active = static_cast<double>(parameters);
  if (c.moe.has_value()) {  // a token runs top_k of the num_experts routed experts
    active -= static_cast<double>(c.num_hidden_layers) * (c.moe->num_experts - c.moe->top_k) * 3.0 *
              c.moe->expert_intermediate_size * c.hidden_size;
  }
  return 6.0 * active + 6.0 * c.num_hidden_layers * static_cast<double>(seq_len) * c.hidden_size +
         12.0 * static_cast<double>(DepthRetrievalReads(c)) * c.hidden_size;
}

}  // namespace satdar::model
