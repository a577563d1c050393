// core/cuda/sim/cublaslt_sim.cc: the cuBLASLt subset of include/cublasLt.h on the CPU.
//
// cublasLtMatmul computes D = alpha * op(A) op(B) + beta * C with cuBLASLt's column-major
// semantics: element (i, j) of a rows x cols layout with leading dimension ld is at
// i + j * ld. Inputs are read as the device reads them (bf16 widened to f32 exactly), products
// are accumulated in f32 (CUBLAS_COMPUTE_32F, no TF32) by OpenBLAS sgemm, and the result
// alpha * acc + beta * C is formed in f32 and rounded to nearest even to D's type. beta == 0
// does not read C (NaNs in it do not propagate), as documented.
//
// Everything outside the subset is an error status plus a Report naming it:
//   CUBLAS_STATUS_NOT_SUPPORTED: an attribute, value, type combination or compute type the
//     simulator does not implement (the library supports many of them);
//   CUBLAS_STATUS_INVALID_VALUE: what the library also rejects (a null argument, a wrong
//     attribute size, inconsistent dimensions, ld < rows), and a device range that is not
//     inside one cudaMalloc allocation, an output overlapping an input, C == D with different
//     layouts (undefined on a device).
// The heuristic returns one algorithm that needs no workspace. It records the alignments the
// caller promised (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, default 256) and the types;
// cublasLtMatmul refuses (NOT_SUPPORTED) pointers that break that promise or a problem of other
// types, which is how a real algorithm chosen for other pointers can fail.
#include <cblas.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda/sim/sim_runtime.h"
#include "core/dtype.h"

struct cublasLtContext {
  uint32_t magic;
};

namespace satdar::cuda_sim {
namespace {

constexpr uint32_t kHandleMagic = 0x4c74486e;        // "LtHn"
constexpr uint32_t kDescMagic = 0x4c744473;          // "LtDs"
constexpr uint32_t kLayoutMagic = 0x4c744c79;        // "LtLy"
constexpr uint32_t kPrefMagic = 0x4c745066;          // "LtPf"
constexpr uint64_t kAlgoMagic = 0x53696d416c676f31;  // "SimAlgo1"
constexpr uint32_t kDefaultAlignment = 256;

struct MatmulDesc {
  uint32_t magic = kDescMagic;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  cublasOperation_t trans_a = CUBLAS_OP_N;
  cublasOperation_t trans_b = CUBLAS_OP_N;
};

struct Layout {
  uint32_t magic = kLayoutMagic;
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};

struct Preference {
  uint32_t magic = kPrefMagic;
  uint64_t max_workspace = 0;
  uint32_t align[4] = {kDefaultAlignment, kDefaultAlignment, kDefaultAlignment,
                       kDefaultAlignment};  // A, B, C, D
};

cublasStatus_t Fail(cublasStatus_t status, const std::string& what) {
  Report("cuBLASLt: " + what);
  return status;
}

MatmulDesc* ToDesc(cublasLtMatmulDesc_t d) {
  auto* p = reinterpret_cast<MatmulDesc*>(d);
  return p != nullptr && p->magic == kDescMagic ? p : nullptr;
}
Layout* ToLayout(cublasLtMatrixLayout_t l) {
  auto* p = reinterpret_cast<Layout*>(l);
  return p != nullptr && p->magic == kLayoutMagic ? p : nullptr;
}
Preference* ToPref(cublasLtMatmulPreference_t pr) {
  auto* p = reinterpret_cast<Preference*>(pr);
  return p != nullptr && p->magic == kPrefMagic ? p : nullptr;
}
bool ValidHandle(cublasLtHandle_t h) { return h != nullptr && h->magic == kHandleMagic; }

size_t ElementSize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
const char* TypeName(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
      return "CUDA_R_32F";
    case CUDA_R_16BF:
      return "CUDA_R_16BF";
    case CUDA_R_16F:
      return "CUDA_R_16F";
    case CUDA_R_64F:
      return "CUDA_R_64F";
    default:
      return "an unsupported cudaDataType_t";
  }
}

// Bytes from the first to one past the last element of a column-major layout.
size_t Span(const Layout& l) {
  return ((l.cols - 1) * static_cast<uint64_t>(l.ld) + l.rows) * ElementSize(l.type);
}

bool Overlap(const void* p, size_t pn, const void* q, size_t qn) {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  return a < b + qn && b < a + pn;
}

// The checks cublasLtMatmulAlgoGetHeuristic and cublasLtMatmul share: the subset's compute and
// type combinations, and dimensions consistent with op(A) (m x k), op(B) (k x n), C/D (m x n).
cublasStatus_t CheckProblem(const MatmulDesc& d, const Layout& a, const Layout& b, const Layout& c,
                            const Layout& lout) {
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                "compute type " + std::to_string(d.compute) + " / scale type " + TypeName(d.scale) +
                    " (the simulator has CUBLAS_COMPUTE_32F / CUDA_R_32F)");
  }
  const bool ab_ok = a.type == b.type && (a.type == CUDA_R_32F || a.type == CUDA_R_16BF);
  const bool cd_ok = c.type == lout.type && (c.type == CUDA_R_32F || c.type == CUDA_R_16BF) &&
                     !(a.type == CUDA_R_32F && c.type == CUDA_R_16BF);
  if (!ab_ok || !cd_ok) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                std::string("type combination A ") + TypeName(a.type) + ", B " + TypeName(b.type) +
                    ", C " + TypeName(c.type) + ", D " + TypeName(lout.type) +
                    " (the simulator has 32F/32F/32F/32F, 16BF/16BF/16BF/16BF and "
                    "16BF/16BF/32F/32F)");
  }
  for (const Layout* l : {&a, &b, &c, &lout}) {
    if (l->rows == 0 || l->cols == 0) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "an empty matrix (rows or cols 0): not simulated, satdar handles k == 0 itself");
    }
    if (l->rows > INT32_MAX || l->cols > INT32_MAX || l->ld > INT32_MAX) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "rows, cols or ld beyond 2^31 - 1 (the simulator's BLAS takes int)");
    }
    if (l->ld < static_cast<int64_t>(l->rows)) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, "leading dimension " + std::to_string(l->ld) +
                                                   " < rows " + std::to_string(l->rows) +
                                                   " (CUBLASLT_ORDER_COL)");
    }
  }
  const bool ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T;
  const uint64_t m = ta ? a.cols : a.rows, ka = ta ? a.rows : a.cols;
  const uint64_t kb = tb ? b.cols : b.rows, n = tb ? b.rows : b.cols;
  if (ka != kb || c.rows != m || c.cols != n || lout.rows != m || lout.cols != n) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE,
                "inconsistent dimensions: op(A) " + std::to_string(m) + "x" + std::to_string(ka) +
                    ", op(B) " + std::to_string(kb) + "x" + std::to_string(n) + ", C " +
                    std::to_string(c.rows) + "x" + std::to_string(c.cols) + ", D " +
                    std::to_string(lout.rows) + "x" + std::to_string(lout.cols));
  }
  return CUBLAS_STATUS_SUCCESS;
}

uint64_t TypesKey(const Layout& a, const Layout& b, const Layout& c, const Layout& d) {
  return static_cast<uint64_t>(a.type) | static_cast<uint64_t>(b.type) << 8 |
         static_cast<uint64_t>(c.type) << 16 | static_cast<uint64_t>(d.type) << 24;
}

// One matmul, captured by value for the stream.
struct Job {
  CBLAS_TRANSPOSE ta, tb;
  int m, n, k;
  float alpha, beta;
  const void* a;
  Layout la;
  const void* b;
  Layout lb;
  const void* c;
  Layout lc;
  void* d;
  Layout lout;
};

// f32 scratch of at least n elements, reused by the calling (stream) thread: a fresh buffer per
// call costs more in zeroing and page faults than the widening itself.
float* Scratch(std::vector<float>* buf, size_t n) {
  if (buf->size() < n) buf->resize(n);
  return buf->data();
}

// A stored (rows x cols, ld) operand as f32: the bf16 one widened exactly into `buf` (ld rows).
const float* AsF32(const void* p, const Layout& l, std::vector<float>* buf, int* ld) {
  if (l.type == CUDA_R_32F) {
    *ld = static_cast<int>(l.ld);
    return static_cast<const float*>(p);
  }
  float* dst = Scratch(buf, l.rows * l.cols);
  const auto* src = static_cast<const uint16_t*>(p);
  for (uint64_t j = 0; j < l.cols; ++j) {
    const uint16_t* col = src + j * l.ld;
    float* out = dst + j * l.rows;
    for (uint64_t i = 0; i < l.rows; ++i) out[i] = core::BF16ToFloat(core::BF16{col[i]});
  }
  *ld = static_cast<int>(l.rows);
  return dst;
}

// Scratch above this many floats (64 MiB) is released after the call instead of kept.
constexpr size_t kKeepScratchFloats = size_t{16} << 20;

struct ScratchSet {
  std::vector<float> a, b, acc;
  void Trim() {
    for (std::vector<float>* v : {&a, &b, &acc}) {
      if (v->size() > kKeepScratchFloats) std::vector<float>().swap(*v);
    }
  }
};

void ComputeWith(const Job& j, ScratchSet* scratch) {
  int lda = 0, ldb = 0;
  const float* a = AsF32(j.a, j.la, &scratch->a, &lda);
  const float* b = AsF32(j.b, j.lb, &scratch->b, &ldb);
  const int ldd = static_cast<int>(j.lout.ld), ldc = static_cast<int>(j.lc.ld);
  if (j.lout.type == CUDA_R_32F) {
    float* d = static_cast<float*>(j.d);
    const float beta = j.beta;
    if (beta != 0.0f && j.c != j.d) {  // D = C first (they do not overlap: checked)
      const float* c = static_cast<const float*>(j.c);
      for (int col = 0; col < j.n; ++col) {
        std::memcpy(d + static_cast<size_t>(col) * ldd, c + static_cast<size_t>(col) * ldc,
                    sizeof(float) * j.m);
      }
    }
    cblas_sgemm(CblasColMajor, j.ta, j.tb, j.m, j.n, j.k, j.alpha, a, lda, b, ldb, beta, d, ldd);
    return;
  }
  // bf16 D: f32 alpha * acc, then + beta * C in f32, one rounding.
  float* acc = Scratch(&scratch->acc, static_cast<size_t>(j.m) * j.n);
  cblas_sgemm(CblasColMajor, j.ta, j.tb, j.m, j.n, j.k, j.alpha, a, lda, b, ldb, 0.0f, acc, j.m);
  const auto* c = static_cast<const uint16_t*>(j.c);
  auto* d = static_cast<uint16_t*>(j.d);
  for (int col = 0; col < j.n; ++col) {
    const float* s = acc + static_cast<size_t>(col) * j.m;
    uint16_t* dc = d + static_cast<size_t>(col) * ldd;
    if (j.beta == 0.0f) {
      for (int i = 0; i < j.m; ++i) dc[i] = core::FloatToBF16(s[i]).bits;
    } else {
      const uint16_t* cc = c + static_cast<size_t>(col) * ldc;
      for (int i = 0; i < j.m; ++i) {
        dc[i] = core::FloatToBF16(s[i] + j.beta * core::BF16ToFloat(core::BF16{cc[i]})).bits;
      }
    }
  }
}

void Compute(const Job& j) {
  thread_local ScratchSet scratch;
  ComputeWith(j, &scratch);
  scratch.Trim();
}

// Reads an attribute value of exactly `size` bytes.
template <typename T>
bool Read(const void* buf, size_t size, T* out) {
  if (buf == nullptr || size != sizeof(T)) return false;
  std::memcpy(out, buf, sizeof(T));
  return true;
}

cublasStatus_t BadSize(const char* attr, size_t size) {
  return Fail(CUBLAS_STATUS_INVALID_VALUE, std::string(attr) + ": null buffer or size " +
                                               std::to_string(size) + " is not the attribute's");
}

cublasStatus_t SetTrans(const char* name, const void* buf, size_t size, cublasOperation_t* op) {
  int32_t v = 0;
  if (!Read(buf, size, &v)) return BadSize(name, size);
  if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                std::string(name) + " = " + std::to_string(v) + " (the simulator has N and T)");
  }
  *op = static_cast<cublasOperation_t>(v);
  return CUBLAS_STATUS_SUCCESS;
}

// The checks of cublasLtMatmul's arguments that do not depend on the device.
cublasStatus_t CheckAlgo(const cublasLtMatmulAlgo_t* algo, const Layout& la, const Layout& lb,
                         const Layout& lc, const Layout& lout, const void* const ptrs[4],
                         void* workspace, size_t workspace_bytes) {
  if (algo != nullptr) {
    if (algo->data[0] != kAlgoMagic) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, "algo not from cublasLtMatmulAlgoGetHeuristic");
    }
    if (algo->data[1] != TypesKey(la, lb, lc, lout)) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "algo chosen by the heuristic for other matrix types");
    }
    static const char* const kNames[4] = {"A", "B", "C", "D"};
    for (int i = 0; i < 4; ++i) {
      const uint64_t align = algo->data[3 + i];
      if (ptrs[i] != nullptr && reinterpret_cast<uintptr_t>(ptrs[i]) % align != 0) {
        return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                    std::string("pointer ") + kNames[i] + " is not aligned to the " +
                        std::to_string(align) +
                        " bytes promised to the heuristic (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_" +
                        kNames[i] + "_BYTES)");
      }
    }
    if (workspace_bytes < algo->data[7]) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, "workspace smaller than the algo needs");
    }
  }
  if (workspace_bytes > 0 && !IsDeviceRange(workspace, workspace_bytes)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE,
                "workspace [" + std::to_string(reinterpret_cast<uintptr_t>(workspace)) + ", +" +
                    std::to_string(workspace_bytes) + ") is not inside one device allocation");
  }
  return CUBLAS_STATUS_SUCCESS;
}

// Device ranges of A, B, C (when read) and D, and the overlaps a device would race on.
cublasStatus_t CheckRanges(const Job& j) {
  const bool read_c = j.beta != 0.0f;
  struct Operand {
    const char* name;
    const void* p;
    size_t bytes;
    bool used;
  };
  const Operand ops[4] = {{"A", j.a, Span(j.la), true},
                          {"B", j.b, Span(j.lb), true},
                          {"C", j.c, Span(j.lc), read_c},
                          {"D", j.d, Span(j.lout), true}};
  for (const Operand& o : ops) {
    if (o.used && !IsDeviceRange(o.p, o.bytes)) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE,
                  std::string("matrix ") + o.name + " [" +
                      std::to_string(reinterpret_cast<uintptr_t>(o.p)) + ", +" +
                      std::to_string(o.bytes) + ") is not inside one device allocation");
    }
  }
  if (j.c == j.d && read_c &&
      (j.lc.rows != j.lout.rows || j.lc.cols != j.lout.cols || j.lc.ld != j.lout.ld ||
       j.lc.type != j.lout.type)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, "in-place C == D with different C and D layouts");
  }
  for (int i = 0; i < 3; ++i) {
    if (!ops[i].used || (i == 2 && j.c == j.d)) continue;
    if (Overlap(ops[i].p, ops[i].bytes, j.d, ops[3].bytes)) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE,
                  std::string("D overlaps ") + ops[i].name + " (a race on a device)");
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace satdar::cuda_sim

using satdar::cuda_sim::BadSize;
using satdar::cuda_sim::CheckAlgo;
using satdar::cuda_sim::CheckProblem;
using satdar::cuda_sim::CheckRanges;
using satdar::cuda_sim::Compute;
using satdar::cuda_sim::ElementSize;
using satdar::cuda_sim::Enqueue;
using satdar::cuda_sim::Fail;
using satdar::cuda_sim::IsDeviceRange;
using satdar::cuda_sim::Job;
using satdar::cuda_sim::kAlgoMagic;
using satdar::cuda_sim::kHandleMagic;
using satdar::cuda_sim::Layout;
using satdar::cuda_sim::MatmulDesc;
using satdar::cuda_sim::Preference;
using satdar::cuda_sim::Read;
using satdar::cuda_sim::Report;
using satdar::cuda_sim::SetTrans;
using satdar::cuda_sim::Span;
using satdar::cuda_sim::ToDesc;
using satdar::cuda_sim::ToLayout;
using satdar::cuda_sim::ToPref;
using satdar::cuda_sim::TypesKey;
using satdar::cuda_sim::ValidHandle;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate(nullptr)");
  *handle = new cublasLtContext{kHandleMagic};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!ValidHandle(handle)) {
    return Fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy of an invalid handle");
  }
  handle->magic = 0;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "<unknown>";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "license error";
  }
  return "unknown cuBLAS status";
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate(nullptr)");
  }
  auto* l = new Layout;
  l->type = type;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  Layout* l = ToLayout(layout);
  if (l == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, "destroying an invalid layout");
  l->magic = 0;
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (desc == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate(null)");
  auto* d = new MatmulDesc;
  d->compute = compute;  // checked when used (CheckProblem)
  d->scale = scale;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  MatmulDesc* d = ToDesc(desc);
  if (d == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, "destroying an invalid matmul desc");
  d->magic = 0;
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  MatmulDesc* d = ToDesc(desc);
  if (d == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, "SetAttribute on an invalid desc");
  int32_t i32 = 0;
  uint32_t u32 = 0;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return SetTrans("CUBLASLT_MATMUL_DESC_TRANSA", buf, size, &d->trans_a);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return SetTrans("CUBLASLT_MATMUL_DESC_TRANSB", buf, size, &d->trans_b);
    case CUBLASLT_MATMUL_DESC_TRANSC:
      if (!Read(buf, size, &i32)) return BadSize("CUBLASLT_MATMUL_DESC_TRANSC", size);
      if (i32 == CUBLAS_OP_N) return CUBLAS_STATUS_SUCCESS;
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT_MATMUL_DESC_TRANSC other than N");
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      if (!Read(buf, size, &i32)) return BadSize("CUBLASLT_MATMUL_DESC_COMPUTE_TYPE", size);
      d->compute = static_cast<cublasComputeType_t>(i32);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      if (!Read(buf, size, &i32)) return BadSize("CUBLASLT_MATMUL_DESC_SCALE_TYPE", size);
      d->scale = static_cast<cudaDataType_t>(i32);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      if (!Read(buf, size, &i32)) return BadSize("CUBLASLT_MATMUL_DESC_POINTER_MODE", size);
      if (i32 == CUBLASLT_POINTER_MODE_HOST) return CUBLAS_STATUS_SUCCESS;
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT_MATMUL_DESC_POINTER_MODE " +
                                                   std::to_string(i32) +
                                                   " (the simulator has "
                                                   "CUBLASLT_POINTER_MODE_HOST)");
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (!Read(buf, size, &u32)) return BadSize("CUBLASLT_MATMUL_DESC_EPILOGUE", size);
      if (u32 == CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_SUCCESS;
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "CUBLASLT_MATMUL_DESC_EPILOGUE " + std::to_string(u32) +
                      " (the simulator has CUBLASLT_EPILOGUE_DEFAULT only)");
    case CUBLASLT_MATMUL_DESC_FILL_MODE:
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "cublasLtMatmulDescAttributes_t " + std::to_string(attr) +
                      " is not simulated (TRANSA, TRANSB, TRANSC N, COMPUTE_TYPE, SCALE_TYPE, "
                      "POINTER_MODE HOST, EPILOGUE DEFAULT are)");
  }
  return Fail(CUBLAS_STATUS_INVALID_VALUE,
              "unknown cublasLtMatmulDescAttributes_t " + std::to_string(attr));
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate(nullptr)");
  }
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  Preference* p = ToPref(pref);
  if (p == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, "destroying an invalid preference");
  p->magic = 0;
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  Preference* p = ToPref(pref);
  if (p == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, "SetAttribute on an invalid pref");
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (!Read(buf, size, &p->max_workspace)) {
        return BadSize("CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES", size);
      }
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      uint32_t v = 0;
      if (!Read(buf, size, &v)) return BadSize("CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES", size);
      if (v == 0) {
        return Fail(CUBLAS_STATUS_INVALID_VALUE, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES 0");
      }
      p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = v;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "cublasLtMatmulPreferenceAttributes_t " + std::to_string(attr) +
                      " is not simulated (MAX_WORKSPACE_BYTES, MIN_ALIGNMENT_[ABCD]_BYTES are)");
  }
  return Fail(CUBLAS_STATUS_INVALID_VALUE,
              "unknown cublasLtMatmulPreferenceAttributes_t " + std::to_string(attr));
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t adesc,
    cublasLtMatrixLayout_t bdesc, cublasLtMatrixLayout_t cdesc, cublasLtMatrixLayout_t ddesc,
    cublasLtMatmulPreference_t preference, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
  if (!ValidHandle(handle)) return Fail(CUBLAS_STATUS_NOT_INITIALIZED, "heuristic: bad handle");
  const MatmulDesc* d = ToDesc(desc);
  const Layout *la = ToLayout(adesc), *lb = ToLayout(bdesc), *lc = ToLayout(cdesc),
               *lout = ToLayout(ddesc);
  const Preference* p = ToPref(preference);
  if (d == nullptr || la == nullptr || lb == nullptr || lc == nullptr || lout == nullptr ||
      p == nullptr || results == nullptr || returned == nullptr || requested <= 0) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE,
                "heuristic: a null or invalid descriptor or result array, or "
                "requestedAlgoCount <= 0");
  }
  *returned = 0;
  const cublasStatus_t st = CheckProblem(*d, *la, *lb, *lc, *lout);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const Layout* ls[4] = {la, lb, lc, lout};
  for (int i = 0; i < 4; ++i) {
    if (p->align[i] % ElementSize(ls[i]->type) != 0) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "heuristic: a promised alignment of " + std::to_string(p->align[i]) +
                      " bytes is not a multiple of the element size: no algorithm");
    }
  }
  cublasLtMatmulHeuristicResult_t r;
  std::memset(&r, 0, sizeof(r));
  r.algo.data[0] = kAlgoMagic;
  r.algo.data[1] = TypesKey(*la, *lb, *lc, *lout);
  r.algo.data[2] = d->compute;
  for (int i = 0; i < 4; ++i) r.algo.data[3 + i] = p->align[i];
  r.algo.data[7] = 0;  // workspace bytes needed
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t adesc, const void* b,
                              cublasLtMatrixLayout_t bdesc, const void* beta, const void* c,
                              cublasLtMatrixLayout_t cdesc, void* d, cublasLtMatrixLayout_t ddesc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  if (!ValidHandle(handle)) return Fail(CUBLAS_STATUS_NOT_INITIALIZED, "matmul: bad handle");
  const MatmulDesc* md = ToDesc(desc);
  const Layout *la = ToLayout(adesc), *lb = ToLayout(bdesc), *lc = ToLayout(cdesc),
               *lout = ToLayout(ddesc);
  if (md == nullptr || la == nullptr || lb == nullptr || lc == nullptr || lout == nullptr ||
      alpha == nullptr || beta == nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE,
                "matmul: a null or invalid descriptor, or a null alpha or beta");
  }
  cublasStatus_t st = CheckProblem(*md, *la, *lb, *lc, *lout);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const void* ptrs[4] = {a, b, c, d};
  st = CheckAlgo(algo, *la, *lb, *lc, *lout, ptrs, workspace, workspace_bytes);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const bool ta = md->trans_a == CUBLAS_OP_T, tb = md->trans_b == CUBLAS_OP_T;
  Job j;
  j.ta = ta ? CblasTrans : CblasNoTrans;
  j.tb = tb ? CblasTrans : CblasNoTrans;
  j.m = static_cast<int>(lout->rows);
  j.n = static_cast<int>(lout->cols);
  j.k = static_cast<int>(ta ? la->rows : la->cols);
  std::memcpy(&j.alpha, alpha, sizeof(float));  // CUBLASLT_POINTER_MODE_HOST: read now
  std::memcpy(&j.beta, beta, sizeof(float));
  j.a = a;
  j.la = *la;
  j.b = b;
  j.lb = *lb;
  j.c = c;
  j.lc = *lc;
  j.d = d;
  j.lout = *lout;
  st = CheckRanges(j);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const cudaError_t e = Enqueue(stream, [j]() -> cudaError_t {
    // The allocations may have been freed between the call and the stream reaching it.
    if (!IsDeviceRange(j.a, Span(j.la)) || !IsDeviceRange(j.b, Span(j.lb)) ||
        !IsDeviceRange(j.d, Span(j.lout)) || (j.beta != 0.0f && !IsDeviceRange(j.c, Span(j.lc)))) {
      Report("cuBLASLt: cublasLtMatmul ran on the stream after an operand was freed");
      return cudaErrorIllegalAddress;
    }
    Compute(j);
    return cudaSuccess;
  });
  if (e != cudaSuccess) {
    return Fail(CUBLAS_STATUS_EXECUTION_FAILED,
                std::string("matmul: queueing on the stream failed: ") + cudaGetErrorString(e));
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
