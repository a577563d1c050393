#include "model/hardware.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/json.h"

namespace satdar::model {

namespace {

constexpr double kMiB = 1048576.0;

// Data-sheet peaks (dense bf16 tensor cores, SXM) and memory sizes as nvidia-smi reports them;
// links per GPU and direction at the ~80% (NVLink) and ~90% (InfiniBand, one NIC per GPU) of
// their line rate that NCCL's bus bandwidth reaches; GEMM and attention efficiencies as cuBLAS
// and FlashAttention-2 reach them on large shapes (docs/SCALING.md, "Hardware table").
Hardware Gpu(const char* name, const char* description, double tflops, double gemm,
             double attention, double hbm_tbps, double memory_mib, int sms, double nvlink_gbps,
             double ib_gbps) {
  Hardware h;
  h.name = name;
  h.description = description;
  h.peak_flops = tflops * 1e12;
  h.gemm_efficiency = gemm;
  h.attention_efficiency = attention;
  h.memory_bandwidth = hbm_tbps * 1e12;
  h.memory_efficiency = 0.8;
  h.memory_bytes = memory_mib * kMiB;
  h.multiprocessors = sms;
  h.intra_node_bandwidth = nvlink_gbps * 1e9;
  h.inter_node_bandwidth = ib_gbps * 1e9;
  h.intra_node_latency = 2e-6;
  h.inter_node_latency = 6e-6;
  h.op_overhead = 5e-6;
  h.cores = 0;
  h.gpu = true;
  return h;
}

std::vector<Hardware> Table() {
  return {
      // NVLink 3: 600 GB/s both ways; HDR InfiniBand 200 Gb/s per GPU.
      Gpu("a100", "NVIDIA A100 SXM4 80 GB", 312, 0.80, 0.60, 2.039, 81920, 108, 240, 22.5),
      // NVLink 4: 900 GB/s both ways; NDR InfiniBand 400 Gb/s per GPU.
      Gpu("h100", "NVIDIA H100 SXM5 80 GB", 989, 0.72, 0.50, 3.35, 81559, 132, 360, 45),
      Gpu("h200", "NVIDIA H200 SXM 141 GB", 989, 0.72, 0.50, 4.8, 143771, 132, 360, 45),
  };
}

}  // namespace

std::vector<std::string> HardwareNames() {
  std::vector<std::string> names;
  for (const Hardware& h : Table()) names.push_back(h.name);
  return names;
}

absl::StatusOr<Hardware> FindHardware(const std::string& name) {
  for (const Hardware& h : Table()) {
    if (h.name == name) return h;
  }
  return absl::NotFoundError(absl::StrCat("no hardware named '", name, "' (known: ",
                                          absl::StrJoin(HardwareNames(), ", "), ")"));
}

absl::StatusOr<Hardware> ParseHardware(const std::string& text, const std::string& source) {
  SATDAR_ASSIGN_OR_RETURN(nlohmann::json j, core::ParseJson(text, source));
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
  };
  if (!j.is_object()) return bad("must be a JSON object of hardware fields");
  Hardware h;
  struct Number {
    const char* key;
    double* value;
    bool fraction;  // in (0, 1]
  };
  const Number numbers[] = {
      {"peak_flops", &h.peak_flops, false},
      {"gemm_efficiency", &h.gemm_efficiency, true},
      {"attention_efficiency", &h.attention_efficiency, true},
      {"memory_bandwidth", &h.memory_bandwidth, false},
      {"memory_efficiency", &h.memory_efficiency, true},
      {"memory_bytes", &h.memory_bytes, false},
      {"intra_node_bandwidth", &h.intra_node_bandwidth, false},
      {"inter_node_bandwidth", &h.inter_node_bandwidth, false},
      {"intra_node_latency", &h.intra_node_latency, false},
      {"inter_node_latency", &h.inter_node_latency, false},
      {"op_overhead", &h.op_overhead, false},
  };
  std::set<std::string> known = {"name", "description", "multiprocessors", "cores", "gpu"};
  for (const Number& n : numbers) {
    known.insert(n.key);
    if (!j.contains(n.key)) return bad(absl::StrCat("field \"", n.key, "\" is missing"));
    const nlohmann::json& v = j[n.key];
    if (!v.is_number()) return bad(absl::StrCat("field \"", n.key, "\" must be a number"));
    *n.value = v.get<double>();
    const bool latency = std::string(n.key).find("latency") != std::string::npos ||
                         std::string(n.key) == "op_overhead";
    if (!std::isfinite(*n.value) || *n.value < 0 || (*n.value == 0 && !latency) ||
        (n.fraction && *n.value > 1)) {
      return bad(absl::StrCat("field \"", n.key, "\" must be ",
                              n.fraction ? "in (0, 1]" : latency ? ">= 0" : "> 0", ", got ",
                              v.dump()));
    }
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!known.count(it.key())) return bad(absl::StrCat("unknown field \"", it.key(), "\""));
  }
  for (const char* key : {"name", "description"}) {
    if (!j.contains(key) || !j[key].is_string() || j[key].get<std::string>().empty()) {
      return bad(absl::StrCat("field \"", key, "\" must be a non-empty string"));
    }
  }
  h.name = j["name"].get<std::string>();
  h.description = j["description"].get<std::string>();
  for (const char* key : {"multiprocessors", "cores"}) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0 ||
        j[key].get<int64_t>() > 1 << 20) {
      return bad(absl::StrCat("field \"", key, "\" must be an integer from 0 to 1048576"));
    }
  }
  h.multiprocessors = j["multiprocessors"].get<int>();
  h.cores = j["cores"].get<int>();
  if (!j.contains("gpu") || !j["gpu"].is_boolean()) {
    return bad("field \"gpu\" must be true or false");
  }
  h.gpu = j["gpu"].get<bool>();
  return h;
}

absl::StatusOr<Hardware> LoadHardware(const std::string& path) {
  SATDAR_ASSIGN_OR_RETURN(std::string text, core::ReadFileToString(path, 1 << 20));
  return ParseHardware(text, path);
}

std::string HardwareToJson(const Hardware& h) {
  nlohmann::json j = {{"name", h.name},
                      {"description", h.description},
                      {"peak_flops", h.peak_flops},
                      {"gemm_efficiency", h.gemm_efficiency},
                      {"attention_efficiency", h.attention_efficiency},
                      {"memory_bandwidth", h.memory_bandwidth},
                      {"memory_efficiency", h.memory_efficiency},
                      {"memory_bytes", h.memory_bytes},
                      {"multiprocessors", h.multiprocessors},
                      {"intra_node_bandwidth", h.intra_node_bandwidth},
                      {"inter_node_bandwidth", h.inter_node_bandwidth},
                      {"intra_node_latency", h.intra_node_latency},
                      {"inter_node_latency", h.inter_node_latency},
                      {"op_overhead", h.op_overhead},
                      {"cores", h.cores},
                      {"gpu", h.gpu}};
  return j.dump(2);
}

}  // namespace satdar::model
