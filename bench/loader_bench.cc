// Loader throughput: how many tokens per second one data-parallel rank's BatchStream delivers
// from a prepared dataset (shuffled windows, background prefetch), to compare with what the
// trainer consumes. Usage: loader_bench DATASET_DIR [SEQ_LEN] [BATCH] [WORLD] [SECONDS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "data/dataset.h"
#include "data/stream.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: loader_bench DATASET_DIR [SEQ_LEN] [BATCH] [WORLD] [SECONDS]\n");
    return 2;
  }
  const int seq_len = argc > 2 ? std::atoi(argv[2]) : 256;
  const int batch = argc > 3 ? std::atoi(argv[3]) : 8;
  const int world = argc > 4 ? std::atoi(argv[4]) : 2;
  const double seconds = argc > 5 ? std::atof(argv[5]) : 3.0;
  auto dataset = satdar::data::Dataset::Open(argv[1], 1 << 30);
  if (!dataset.ok()) {
    std::fprintf(stderr, "%s\n", std::string(dataset.status().message()).c_str());
    return 2;
  }
  satdar::data::DatasetBatches source(*dataset, satdar::data::Split::kTrain, seq_len, 0);
  satdar::data::BatchStream stream(&source, {seq_len, batch, 1, /*rank=*/world - 1, world, 1, 0});
  std::vector<int32_t> tokens;
  int64_t delivered = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    stream.Next(&tokens);
    delivered += static_cast<int64_t>(batch) * seq_len;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::printf("loader: rank %d of %d, batch %d x %d: %.0f tokens/s delivered (%.1f s)\n",
              world - 1, world, batch, seq_len, delivered / elapsed, elapsed);
  return 0;
}
