// model/hardware.h: what the step-time model (model/step_time.h) needs to know about a device
// and its links: peak FLOP/s and the fraction GEMMs and fused attention reach, memory bandwidth,
// the links inside a node (NVLink) and between nodes (InfiniBand), and per-op overheads.
//
//   SATDAR_ASSIGN_OR_RETURN(Hardware h, FindHardware("h200"));       // the built-in table
//   SATDAR_ASSIGN_OR_RETURN(Hardware h, LoadHardware("cpu.json"));   // a measured machine
//
// The table's numbers are the vendors' data-sheet peaks (dense bf16, SXM parts, one NIC per GPU)
// times efficiencies that well-tuned libraries reach (docs/SCALING.md cites them); a file gives
// every field by name, for another GPU or for a CPU whose numbers bench/plan_accuracy.sh
// measures.
#ifndef SATDAR_MODEL_HARDWARE_H_
#define SATDAR_MODEL_HARDWARE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace satdar::model {

struct Hardware {
  std::string name;                  // "h200"
  std::string description;           // "NVIDIA H200 SXM 141 GB"
  double peak_flops = 0;             // dense FLOP/s of the compute dtype, per device (CPU: per core)
  double gemm_efficiency = 0;        // fraction of the peak a large GEMM sustains
  double attention_efficiency = 0;   // fraction a fused causal attention sustains (its FLOPs)
  double memory_bandwidth = 0;       // bytes/s of device memory (CPU: what one core streams)
  double memory_efficiency = 0;      // fraction of it elementwise ops reach
  double memory_bytes = 0;           // device memory (CPU: the machine's)
  int multiprocessors = 0;           // SMs: GEMM tiles of 128 x 128 run in waves (0: no tiling)
  double intra_node_bandwidth = 0;   // bytes/s per device per direction inside a node
  double inter_node_bandwidth = 0;   // bytes/s per device per direction between nodes
  double intra_node_latency = 0;     // seconds per step of a collective inside a node
  double inter_node_latency = 0;     // seconds per step between nodes
  double op_overhead = 0;            // seconds each op costs beyond its roofline (launch, sync)
  int cores = 0;                     // CPU: cores the node's ranks share (0: one device per rank)
  bool gpu = true;                   // bf16 mixed precision, flash attention, overlapped comm
};

// The built-in devices, by name ("a100", "h100", "h200"); NotFound lists the names.
absl::StatusOr<Hardware> FindHardware(const std::string& name);
std::vector<std::string> HardwareNames();

// A JSON object with every field of Hardware (names as above); InvalidArgument naming the file
// and the field for a missing, unknown, mistyped or non-positive value.
absl::StatusOr<Hardware> LoadHardware(const std::string& path);
absl::StatusOr<Hardware> ParseHardware(const std::string& json_text, const std::string& source);
std::string HardwareToJson(const Hardware& h);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_HARDWARE_H_
