#include "model/gpu/gpu_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "model/model.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/cuda/workspace.h"
#include "core/exec.h"
#include "core/ops/attention_cuda.h"
#include "core/ops/cuda_ops.h"
#include "core/ops/gemm_cuda.h"
#include "core/ops/rope.h"
#include "model/gpu/device_arena.h"
#include "model/gpu/gpu_denseformer.h"
#include "model/gpu/gpu_depth.h"
#include "model/gpu/gpu_hyper.h"
#include "model/gpu/gpu_moe.h"
#include "model/gpu/gpu_muddformer.h"
#include "model/gpu/train_kernels.h"
#include "model/variants/resformer_ops.h"
#include "model/variants/satformer_ops.h"
#endif

namespace satdar::model::gpu {

#ifndef SATDAR_WITH_CUDA

absl::StatusOr<std::unique_ptr<GpuModel>> GpuModel::Create(const ModelConfig& config,
                                                          const GpuModelOptions& options,
                                                          CUstream_st* stream,
                                                          core::cuda::CachingAllocator* alloc) {
  (void)config, (void)options, (void)stream, (void)alloc;
  return absl::FailedPreconditionError("this satdar was built without CUDA");
}

#else  // SATDAR_WITH_CUDA

namespace {

namespace kc = ::satdar::core::cuda;

#define GPU_CHECK(call) SATDAR_CUDA_RETURN_IF_ERROR(call)

std::string LayerName(int i, const char* suffix) {
  return absl::StrCat("model.layers.", i, ".", suffix);
}

template <typename T>
class GpuDecoder : public GpuModel {
 public:
  static constexpr core::DType kDt =
      std::is_same<T, float>::value ? core::DType::kF32 : core::DType::kBF16;

  GpuDecoder(const ModelConfig& c, const GpuModelOptions& o, cudaStream_t stream,
             kc::CachingAllocator* alloc, ParamTable table)
      : c_(c),
        o_(o),
        stream_(stream),
        alloc_(alloc),
        table_(std::move(table)),
        sublayers_(2 * c.num_hidden_layers),
        dar_(c.residual == Residual::kDar),
        attnres_(c.residual == Residual::kAttnRes),
        denseformer_(c.residual == Residual::kDenseFormer),
        hyper_residual_(c.residual == Residual::kHc || c.residual == Residual::kMhc),
        muddformer_(c.residual == Residual::kMuddFormer),
        depth_(dar_ || attnres_),
        satformer_(c.value_residual == ValueResidualKind::kSatFormer),
        resformer_(c.value_residual == ValueResidualKind::kResFormer),
        value_res_(satformer_ || resformer_),
        learnable_res_(resformer_ && c.resformer_mode == ResformerMode::kLearnablePlus),
        d_(c.hidden_size),
        nh_(c.num_attention_heads),
        nkv_(c.num_key_value_heads),
        hs_(c.head_size()),
        f_(c.intermediate_size),
        v_(c.vocab_size),
        eps_(static_cast<float>(c.rms_norm_eps)),
        workspace_(alloc, stream),
        arena_(alloc, stream) {}

  ~GpuDecoder() override {
    cudaStreamSynchronize(stream_);
    arena_.FreeAll();
    if (w_copy_ != nullptr) (void)alloc_->Free(w_copy_);
    if (pinned_) cudaFreeHost(pinned_);
    if (copied_) cudaEventDestroy(copied_);
  }

  absl::Status Init() {
    SATDAR_ASSIGN_OR_RETURN(gemm_, kc::GemmHandle::Create(stream_));
    GPU_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    const int layers = c_.num_hidden_layers;
    off_.resize(layers);
    for (int i = 0; i < layers; ++i) {
      LayerOffsets& o = off_[i];
      o.ln_attn = Off(LayerName(i, "input_layernorm.weight"));
      o.wq = Off(LayerName(i, "self_attn.q_proj.weight"));
      o.wk = Off(LayerName(i, "self_attn.k_proj.weight"));
      o.wv = Off(LayerName(i, "self_attn.v_proj.weight"));
      o.wo = Off(LayerName(i, "self_attn.o_proj.weight"));
      if (c_.qk_norm) {
        o.q_norm = Off(LayerName(i, "self_attn.q_norm.weight"));
        o.k_norm = Off(LayerName(i, "self_attn.k_norm.weight"));
      }
      if (satformer_ && i >= 1) o.gate = Off(LayerName(i, "self_attn.value_gate.weight"));
      if (resformer_ && learnable_res_ && i >= 1) o.lambda2 = Off(LayerName(i, "self_attn.lambda2"));
      o.ln_mlp = Off(LayerName(i, "post_attention_layernorm.weight"));
      if (c_.moe.has_value()) continue;  // the experts' offsets are GpuMoe's
      o.w_gate = Off(LayerName(i, "mlp.gate_proj.weight"));
      o.w_up = Off(LayerName(i, "mlp.up_proj.weight"));
      o.w_down = Off(LayerName(i, "mlp.down_proj.weight"));
      if (o.w_up != o.w_gate + static_cast<int64_t>(f_) * d_) {
        return absl::InternalError("gate_proj and up_proj are not adjacent in the param table");
      }
    }
    if (c_.moe.has_value()) {
      SATDAR_ASSIGN_OR_RETURN(
          moe_, GpuMoe<T>::Create(
                    c_, stream_, gemm_.get(), alloc_,
                    [this](const std::string& name) { return Off(name); }, &workspace_));
    }
    if (resformer_ && learnable_res_) {
      res_scale_off_ = Off("model.value_residual.lambda_scale");
      res_logits_off_ = Off("model.value_residual.lambda_logits");
    }
    auto offset_of = [this](const std::string& name) { return Off(name); };
    if (denseformer_) {
      dense_ = std::make_unique<GpuDenseFormer<T>>(c_, stream_, alloc_, offset_of, &workspace_);
    }
    if (hyper_residual_) {
      SATDAR_ASSIGN_OR_RETURN(
          hyper_, GpuHyper<T>::Create(c_, stream_, gemm_.get(), alloc_, offset_of, &workspace_));
    }
    if (muddformer_) {
      mudd_ = std::make_unique<GpuMuddFormer<T>>(c_, stream_, gemm_.get(), alloc_, offset_of);
    }
    embed_off_ = Off("model.embed_tokens.weight");
    norm_off_ = Off("model.norm.weight");
    head_off_ = c_.tie_word_embeddings ? embed_off_ : Off("lm_head.weight");
    if (depth_) {
      depth_res_ =
          std::make_unique<GpuDepthResidual<T>>(c_, stream_, alloc_, offset_of, &workspace_);
    }
    if (kDt != core::DType::kF32) {
      SATDAR_ASSIGN_OR_RETURN(void* raw, alloc_->Allocate(table_.size() * sizeof(T), stream_));
      w_copy_ = static_cast<T*>(raw);
    }
    return absl::OkStatus();
  }

  const ParamTable& params() const override { return table_; }
  const ModelConfig& config() const override { return c_; }
  int64_t activation_bytes() const override {
    return arena_.bytes() + (moe_ ? moe_->activation_bytes() : 0) +
           (dense_ ? dense_->activation_bytes() : 0) + (hyper_ ? hyper_->activation_bytes() : 0) +
           (mudd_ ? mudd_->activation_bytes() : 0) +
           (depth_res_ ? depth_res_->activation_bytes() : 0) +
           static_cast<int64_t>(workspace_.capacity());  // the ops' scratch
  }
  void SetLayerGradientsReadyHook(std::function<void(int)> hook) override {
    hook_ = std::move(hook);
  }

  absl::Status SetWeights(const float* master) override {
    master_ = master;
    if constexpr (std::is_same<T, float>::value) {
      w_ = master;
    } else {
      SATDAR_RETURN_IF_ERROR(CastFromF32(Exec(), w_copy_, master, table_.size()));
      w_ = w_copy_;
    }
    return absl::OkStatus();
  }

  absl::Status Forward(const int32_t* tokens, int b, int t, double loss_scale,
                       double* loss_acc) override {
    if (w_ == nullptr) return absl::FailedPreconditionError("GpuModel::Forward before SetWeights");
    SATDAR_RETURN_IF_ERROR(Resize(b, t));
    const int n = b * t;
    // The previous upload must be done before the staging buffer is rewritten.
    GPU_CHECK(cudaEventSynchronize(copied_));
    for (int64_t i = 0; i < static_cast<int64_t>(b) * (t + 1); ++i) {
      if (tokens[i] < 0 || tokens[i] >= v_) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " at position ", i,
                                                       " is outside [0, ", v_, ")"));
      }
    }
    for (int bi = 0; bi < b; ++bi) {
      for (int ti = 0; ti < t; ++ti) {
        pinned_[bi * t + ti] = tokens[bi * (t + 1) + ti];
        pinned_[n + bi * t + ti] = tokens[bi * (t + 1) + ti + 1];
      }
    }
    GPU_CHECK(cudaMemcpyAsync(inputs_, pinned_, 2 * sizeof(int32_t) * n, cudaMemcpyHostToDevice,
                              stream_));
    GPU_CHECK(cudaEventRecord(copied_, stream_));
    loss_acc_ = evaluating_ ? nullptr : loss_acc;  // the MoE layers add their aux and z losses
    loss_scale_ = loss_scale;
    SATDAR_RETURN_IF_ERROR(kc::EmbeddingForward(Exec(), h0_, inputs_, W(embed_off_), n, d_));
    auto branch = [this](int l, const T* u, T* y) { return BranchForward(l, u, y); };
    if (depth_) {
      SATDAR_RETURN_IF_ERROR(depth_res_->Forward(w_, master_, branch));
    } else if (denseformer_) {
      SATDAR_RETURN_IF_ERROR(dense_->Forward(master_, branch));
    } else if (hyper_) {
      SATDAR_RETURN_IF_ERROR(hyper_->Forward(w_, master_, h0_, x_final_, branch));
    } else if (mudd_) {
      SATDAR_RETURN_IF_ERROR(mudd_->Forward(w_, master_, MuddBranches()));
    } else {
      for (int l = 1; l <= sublayers_; ++l) {
        SATDAR_RETURN_IF_ERROR(BranchForward(l, h_[l - 1], y_));
        SATDAR_RETURN_IF_ERROR(Add(Exec(), h_[l], h_[l - 1], y_, static_cast<int64_t>(n) * d_));
      }
    }
    SATDAR_RETURN_IF_ERROR(
        kc::RmsNormForward(Exec(), lnf_, rstd_f_, x_final_, W(norm_off_), n, d_, eps_));
    SATDAR_RETURN_IF_ERROR(kc::MatmulForward(Exec(), kDt, logits_, lnf_, W(head_off_), n, v_, d_));
    if (evaluating_) {
      SATDAR_RETURN_IF_ERROR(kc::CrossEntropyForward(Exec(), losses_, logits_, targets(), n, v_));
    } else {
      // The logits become their own gradient (loss_scale / N per position).
      SATDAR_RETURN_IF_ERROR(kc::CrossEntropyForwardBackward(
          Exec(), losses_, logits_, logits_, targets(), static_cast<float>(loss_scale / n), n, v_));
    }
    SATDAR_RETURN_IF_ERROR(AccumulateLoss(Exec(), loss_acc, losses_, n, loss_scale / n));
    forwarded_ = true;
    return absl::OkStatus();
  }

  absl::Status Evaluate(const int32_t* tokens, int b, int t, double* ce_acc) override {
    evaluating_ = true;
    absl::Status s = Forward(tokens, b, t, 1.0, ce_acc);
    evaluating_ = false;
    forwarded_ = false;
    return s;
  }

  absl::Status Backward(float* grads) override {
    if (!forwarded_) return absl::FailedPreconditionError("GpuModel::Backward without Forward");
    forwarded_ = false;
    loss_acc_ = nullptr;  // a recomputed forward adds no loss
    g_ = grads;
    const int n = b_ * t_;
    const size_t nc = static_cast<size_t>(n) * d_;
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardInput(Exec(), kDt, lnf_grad_, logits_, W(head_off_), n, v_, d_, 0.0f));
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardWeightF32(Exec(), kDt, g_ + head_off_, logits_, lnf_, n, v_, d_));
    GPU_CHECK(cudaMemsetAsync(dx_final_, 0, nc * sizeof(T), stream_));
    if (value_res_) {
      GPU_CHECK(cudaMemsetAsync(dv1_, 0, static_cast<size_t>(n) * nkv_ * hs_ * sizeof(T), stream_));
    }
    SATDAR_RETURN_IF_ERROR(kc::RmsNormBackward(Exec(), dx_final_, g_ + norm_off_, lnf_grad_,
                                               x_final_, W(norm_off_), rstd_f_, n, d_));
    auto branch = [this](int l, const T* u, const T* dy, T* du) {
      return BranchBackward(l, u, dy, du);
    };
    if (depth_) {
      SATDAR_RETURN_IF_ERROR(depth_res_->Backward(w_, master_, g_, dx_final_, branch, &dh0_));
    } else if (denseformer_) {
      SATDAR_RETURN_IF_ERROR(dense_->Backward(master_, g_, dx_final_, branch, &dh0_));
    } else if (hyper_) {
      SATDAR_RETURN_IF_ERROR(hyper_->Backward(w_, master_, g_, dx_final_, branch, &dh0_));
    } else if (mudd_) {
      SATDAR_RETURN_IF_ERROR(mudd_->Backward(w_, master_, g_, MuddBranches(), &dh0_));
    } else {
      // dx_final_ carries d loss / d h_l down the stream; each branch adds its path in place.
      for (int l = sublayers_; l >= 1; --l) {
        SATDAR_RETURN_IF_ERROR(BranchBackward(l, h_[l - 1], dx_final_, dx_final_));
      }
      dh0_ = dx_final_;
    }
    SATDAR_RETURN_IF_ERROR(kc::EmbeddingBackward(Exec(), g_ + embed_off_, dh0_, inputs_, n, d_));
    return absl::OkStatus();
  }

 private:
  struct LayerOffsets {
    int64_t ln_attn = -1, wq = -1, wk = -1, wv = -1, wo = -1, q_norm = -1, k_norm = -1;
    int64_t gate = -1, lambda2 = -1, ln_mlp = -1, w_gate = -1, w_up = -1, w_down = -1;
  };
  // What a layer's branches save for their backward (shared by all layers with recompute).
  struct LayerActs {
    T *x_attn = nullptr, *q_raw = nullptr, *k_raw = nullptr, *v = nullptr, *q = nullptr,
      *k = nullptr, *vmix = nullptr, *att = nullptr;
    float *rstd_attn = nullptr, *q_rstd = nullptr, *k_rstd = nullptr, *alpha = nullptr,
          *lse = nullptr;
    T *z = nullptr, *gate_up = nullptr, *act = nullptr;
    float* rstd_mlp = nullptr;
  };

  const T* W(int64_t off) const { return w_ + off; }
  // ResFormer's lambda parameters of layer i in `base` (the fp32 master weights or gradients);
  // null pointers in fixed mode.
  ResformerLambdas<float> Resformer(int i, const float* base) const {
    ResformerLambdas<float> p;
    p.layer = i;
    p.layers = c_.num_hidden_layers;
    if (learnable_res_) {
      p.scale = base + res_scale_off_;
      p.logits = base + res_logits_off_;
      p.lambda2 = base + off_[i].lambda2;
    }
    return p;
  }
  // Where tensor `name` starts in the device buffers.
  int64_t Off(const std::string& name) const { return table_.Offset(name); }
  const int32_t* targets() const { return inputs_ + static_cast<size_t>(b_) * t_; }

  // An activation or scratch buffer of (B, T), freed by the next Resize.
  template <typename U>
  absl::Status Act(U** p, size_t count) {
    return arena_.Alloc(p, count);
  }

  absl::Status Resize(int b, int t) {
    if (b == b_ && t == t_) return absl::OkStatus();
    GPU_CHECK(cudaStreamSynchronize(stream_));
    arena_.FreeAll();
    b_ = t_ = 0;  // set once everything is allocated
    const size_t n = static_cast<size_t>(b) * t, nc = n * d_;
    const size_t qd = static_cast<size_t>(nh_) * hs_, kd = static_cast<size_t>(nkv_) * hs_;
    if (pinned_) cudaFreeHost(pinned_);
    pinned_ = nullptr;
    GPU_CHECK(cudaMallocHost(&pinned_, 2 * n * sizeof(int32_t)));
    SATDAR_RETURN_IF_ERROR(Act(&inputs_, 2 * n));
    // RoPE tables (T, HS/2), computed as on the CPU.
    std::vector<float> cos, sin;
    core::cpu::RopeTables(&cos, &sin, t, hs_, c_.rope_theta);
    SATDAR_RETURN_IF_ERROR(Act(&cos_, cos.size()));
    SATDAR_RETURN_IF_ERROR(Act(&sin_, sin.size()));
    GPU_CHECK(cudaMemcpyAsync(cos_, cos.data(), cos.size() * sizeof(float), cudaMemcpyHostToDevice,
                              stream_));
    GPU_CHECK(cudaMemcpyAsync(sin_, sin.data(), sin.size() * sizeof(float), cudaMemcpyHostToDevice,
                              stream_));
    // Per-layer saved activations (one shared set with recompute).
    const int layers = c_.num_hidden_layers;
    const int sets = o_.recompute ? 1 : layers;
    acts_.assign(layers, LayerActs());
    for (int i = 0; i < sets; ++i) {
      LayerActs& a = acts_[i];
      SATDAR_RETURN_IF_ERROR(Act(&a.x_attn, nc));
      SATDAR_RETURN_IF_ERROR(Act(&a.rstd_attn, n));
      SATDAR_RETURN_IF_ERROR(Act(&a.q_raw, n * qd));
      SATDAR_RETURN_IF_ERROR(Act(&a.k_raw, n * kd));
      if (c_.qk_norm) {
        SATDAR_RETURN_IF_ERROR(Act(&a.q, n * qd));
        SATDAR_RETURN_IF_ERROR(Act(&a.k, n * kd));
        SATDAR_RETURN_IF_ERROR(Act(&a.q_rstd, n * nh_));
        SATDAR_RETURN_IF_ERROR(Act(&a.k_rstd, n * nkv_));
      } else {
        a.q = a.q_raw;  // RoPE in place
        a.k = a.k_raw;
      }
      // Layer 1's values are V1 (v1_ below), and it has no gate or mix.
      const bool own_layer0 = value_res_ && i == 0 && !o_.recompute;
      if (!own_layer0) SATDAR_RETURN_IF_ERROR(Act(&a.v, n * kd));
      if (value_res_ && !own_layer0) SATDAR_RETURN_IF_ERROR(Act(&a.vmix, n * kd));
      if (satformer_ && !own_layer0) SATDAR_RETURN_IF_ERROR(Act(&a.alpha, n * nkv_));
      SATDAR_RETURN_IF_ERROR(Act(&a.att, n * qd));
      SATDAR_RETURN_IF_ERROR(Act(&a.lse, n * nh_));
      SATDAR_RETURN_IF_ERROR(Act(&a.z, nc));
      SATDAR_RETURN_IF_ERROR(Act(&a.rstd_mlp, n));
      if (!moe_) {
        SATDAR_RETURN_IF_ERROR(Act(&a.gate_up, n * 2 * f_));
        SATDAR_RETURN_IF_ERROR(Act(&a.act, n * f_));
      }
    }
    if (moe_) {
      SATDAR_RETURN_IF_ERROR(moe_->Resize(b, t, o_.recompute));
    }
    for (int i = sets; i < layers; ++i) acts_[i] = acts_[0];
    if (value_res_) {
      // Layer 1's values are V1, read by every later layer: never shared.
      SATDAR_RETURN_IF_ERROR(Act(&v1_, n * kd));
      SATDAR_RETURN_IF_ERROR(Act(&dv1_, n * kd));
      acts_[0].v = v1_;
    }
    if (satformer_) SATDAR_RETURN_IF_ERROR(Act(&dalpha_, n * nkv_));
    // Backward scratch.
    SATDAR_RETURN_IF_ERROR(Act(&datt_, n * qd));
    SATDAR_RETURN_IF_ERROR(Act(&dq_, n * qd));
    SATDAR_RETURN_IF_ERROR(Act(&dk_, n * kd));
    SATDAR_RETURN_IF_ERROR(Act(&dv_, n * kd));
    SATDAR_RETURN_IF_ERROR(Act(&dv_raw_, n * kd));
    if (c_.qk_norm) {
      SATDAR_RETURN_IF_ERROR(Act(&dq_raw_, n * qd));
      SATDAR_RETURN_IF_ERROR(Act(&dk_raw_, n * kd));
    } else {
      dq_raw_ = dq_;
      dk_raw_ = dk_;
    }
    SATDAR_RETURN_IF_ERROR(Act(&dx_, nc));
    if (!moe_) {
      SATDAR_RETURN_IF_ERROR(Act(&dact_, n * f_));
      SATDAR_RETURN_IF_ERROR(Act(&dgate_up_, n * 2 * f_));
    }
    SATDAR_RETURN_IF_ERROR(Act(&y_, nc));
    // Decoder ends.
    SATDAR_RETURN_IF_ERROR(Act(&h0_, nc));
    SATDAR_RETURN_IF_ERROR(Act(&x_final_, nc));
    SATDAR_RETURN_IF_ERROR(Act(&dx_final_, nc));
    SATDAR_RETURN_IF_ERROR(Act(&lnf_, nc));
    SATDAR_RETURN_IF_ERROR(Act(&lnf_grad_, nc));
    SATDAR_RETURN_IF_ERROR(Act(&rstd_f_, n));
    SATDAR_RETURN_IF_ERROR(Act(&logits_, n * v_));
    SATDAR_RETURN_IF_ERROR(Act(&losses_, n));
    if (depth_) {
      SATDAR_RETURN_IF_ERROR(depth_res_->Resize(b, t, h0_, x_final_));
    } else if (hyper_) {
      SATDAR_RETURN_IF_ERROR(hyper_->Resize(b, t));
    } else if (mudd_) {
      SATDAR_RETURN_IF_ERROR(mudd_->Resize(b, t, h0_, x_final_, dx_final_));
    } else {
      // The stream after each sublayer; h_[0] is the embedding, h_[2L] the final state.
      h_.assign(sublayers_ + 1, nullptr);
      h_[0] = h0_;
      for (int l = 1; l < sublayers_; ++l) SATDAR_RETURN_IF_ERROR(Act(&h_[l], nc));
      h_[sublayers_] = x_final_;
      if (dense_) {
        SATDAR_RETURN_IF_ERROR(dense_->Resize(b, t, h_, y_));
      }
    }
    // The RoPE tables' host vectors go out of scope here.
    GPU_CHECK(cudaStreamSynchronize(stream_));
    b_ = b;
    t_ = t;
    return absl::OkStatus();
  }

  // MUDDFormer's view of the branches.
  typename GpuMuddFormer<T>::Branches MuddBranches() {
    typename GpuMuddFormer<T>::Branches br;
    br.attention = [this](int i, const T* xq, const T* xk, const T* xv, T* y) {
      return AttentionForward(i, xq, xk, xv, y);
    };
    br.attention_backward = [this](int i, const T* xq, const T* xk, const T* xv, const T* dy,
                                   T* dxq, T* dxk, T* dxv) {
      return AttentionBackward(i, xq, xk, xv, dy, dxq, dxk, dxv);
    };
    br.forward = [this](int l, const T* u, T* y) { return BranchForward(l, u, y); };
    br.backward = [this](int l, const T* u, const T* dy, T* du) {
      return BranchBackward(l, u, dy, du);
    };
    return br;
  }

  // ---- Branches (model/branches.cc): sublayer l = 2i+1 is layer i's attention, 2i+2 its FFN.
  absl::Status BranchForward(int l, const T* u, T* y) {
    const int i = (l - 1) / 2;
    const LayerOffsets& o = off_[i];
    LayerActs& a = acts_[i];
    const int n = b_ * t_;
    if (l % 2 == 0) {
      SATDAR_RETURN_IF_ERROR(
          kc::RmsNormForward(Exec(), a.z, a.rstd_mlp, u, W(o.ln_mlp), n, d_, eps_));
      if (moe_) return moe_->Forward(i, w_, a.z, y, loss_acc_, loss_scale_);
      SATDAR_RETURN_IF_ERROR(
          kc::MatmulForward(Exec(), kDt, a.gate_up, a.z, W(o.w_gate), n, 2 * f_, d_));
      SATDAR_RETURN_IF_ERROR(kc::SwigluForward(Exec(), a.act, a.gate_up, n, f_));
      return kc::MatmulForward(Exec(), kDt, y, a.act, W(o.w_down), n, d_, f_);
    }
    SATDAR_RETURN_IF_ERROR(
        kc::RmsNormForward(Exec(), a.x_attn, a.rstd_attn, u, W(o.ln_attn), n, d_, eps_));
    return AttentionForward(i, a.x_attn, a.x_attn, a.x_attn, y);
  }

  // y = attention of layer i on the normed inputs of its q, k and v projections (all one
  // normed u in a decoder layer; three in MUDDFormer).
  absl::Status AttentionForward(int i, const T* xq, const T* xk, const T* xv, T* y) {
    const LayerOffsets& o = off_[i];
    LayerActs& a = acts_[i];
    const int n = b_ * t_;
    const int qd = nh_ * hs_, kd = nkv_ * hs_;
    SATDAR_RETURN_IF_ERROR(kc::MatmulForward(Exec(), kDt, a.q_raw, xq, W(o.wq), n, qd, d_));
    SATDAR_RETURN_IF_ERROR(kc::MatmulForward(Exec(), kDt, a.k_raw, xk, W(o.wk), n, kd, d_));
    SATDAR_RETURN_IF_ERROR(kc::MatmulForward(Exec(), kDt, a.v, xv, W(o.wv), n, kd, d_));
    if (c_.qk_norm) {
      SATDAR_RETURN_IF_ERROR(
          kc::RmsNormForward(Exec(), a.q, a.q_rstd, a.q_raw, W(o.q_norm), n * nh_, hs_, eps_));
      SATDAR_RETURN_IF_ERROR(
          kc::RmsNormForward(Exec(), a.k, a.k_rstd, a.k_raw, W(o.k_norm), n * nkv_, hs_, eps_));
    }
    SATDAR_RETURN_IF_ERROR(kc::RopeForward(Exec(), a.q, cos_, sin_, b_, t_, nh_, hs_));
    SATDAR_RETURN_IF_ERROR(kc::RopeForward(Exec(), a.k, cos_, sin_, b_, t_, nkv_, hs_));
    const T* values = a.v;
    if (satformer_ && i >= 1) {
      SATDAR_RETURN_IF_ERROR(ops::ValueGateForward<T>(Exec(), a.alpha, xv, W(o.gate), n, nkv_, d_));
      SATDAR_RETURN_IF_ERROR(
          ops::ValueMixForward<T>(Exec(), a.vmix, a.alpha, a.v, v1_, n, nkv_, hs_));
      values = a.vmix;
    } else if (resformer_ && i >= 1) {
      SATDAR_RETURN_IF_ERROR(
          ops::ResformerMixForward(Exec(), a.vmix, v1_, a.v, Resformer(i, master_), n * kd));
      values = a.vmix;
    }
    SATDAR_RETURN_IF_ERROR(
        kc::AttentionForward(Exec(), kDt, a.att, a.lse, a.q, a.k, values, b_, t_, nh_, nkv_, hs_));
    return kc::MatmulForward(Exec(), kDt, y, a.att, W(o.wo), n, d_, qd);
  }

  // du += d/du <dy, f_l(u)>. dy may alias du: it is read before du is written.
  absl::Status BranchBackward(int l, const T* u, const T* dy, T* du) {
    const int i = (l - 1) / 2;
    if (l % 2 == 0 && hook_ && i + 1 < c_.num_hidden_layers) hook_(i + 1);
    const LayerOffsets& o = off_[i];
    const LayerActs& a = acts_[i];
    const int n = b_ * t_;
    float* g = g_;
    if (l % 2 == 1) {
      if (o_.recompute) {
        SATDAR_RETURN_IF_ERROR(
            kc::RmsNormForward(Exec(), a.x_attn, a.rstd_attn, u, W(o.ln_attn), n, d_, eps_));
      }
      // dx collects the normed input's gradient: the gate's part, then the projections'.
      GPU_CHECK(cudaMemsetAsync(dx_, 0, static_cast<size_t>(n) * d_ * sizeof(T), stream_));
      SATDAR_RETURN_IF_ERROR(AttentionBackward(i, a.x_attn, a.x_attn, a.x_attn, dy, dx_, dx_, dx_));
      SATDAR_RETURN_IF_ERROR(
          kc::RmsNormBackward(Exec(), du, g + o.ln_attn, dx_, u, W(o.ln_attn), a.rstd_attn, n, d_));
      return absl::OkStatus();
    }
    if (o_.recompute) SATDAR_RETURN_IF_ERROR(BranchForward(l, u, y_));
    if (moe_) {
      SATDAR_RETURN_IF_ERROR(moe_->Backward(i, w_, g, a.z, dy, dx_, loss_scale_));
      SATDAR_RETURN_IF_ERROR(
          kc::RmsNormBackward(Exec(), du, g + o.ln_mlp, dx_, u, W(o.ln_mlp), a.rstd_mlp, n, d_));
      return absl::OkStatus();
    }
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardInput(Exec(), kDt, dact_, dy, W(o.w_down), n, d_, f_, 0.0f));
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardWeightF32(Exec(), kDt, g + o.w_down, dy, a.act, n, d_, f_));
    SATDAR_RETURN_IF_ERROR(kc::SwigluBackward(Exec(), dgate_up_, dact_, a.gate_up, n, f_));
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardInput(Exec(), kDt, dx_, dgate_up_, W(o.w_gate), n, 2 * f_, d_, 0.0f));
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardWeightF32(Exec(), kDt, g + o.w_gate, dgate_up_, a.z, n, 2 * f_, d_));
    SATDAR_RETURN_IF_ERROR(
        kc::RmsNormBackward(Exec(), du, g + o.ln_mlp, dx_, u, W(o.ln_mlp), a.rstd_mlp, n, d_));
    return absl::OkStatus();
  }

  // dxq, dxk, dxv += the input gradients of AttentionForward (they may alias).
  absl::Status AttentionBackward(int i, const T* xq, const T* xk, const T* xv, const T* dy,
                                 T* dxq, T* dxk, T* dxv) {
    if (o_.recompute) SATDAR_RETURN_IF_ERROR(AttentionForward(i, xq, xk, xv, y_));
    const LayerOffsets& o = off_[i];
    const LayerActs& a = acts_[i];
    const int n = b_ * t_;
    float* g = g_;
    const int qd = nh_ * hs_, kd = nkv_ * hs_;
    const size_t nq = static_cast<size_t>(n) * qd, nk = static_cast<size_t>(n) * kd;
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardInput(Exec(), kDt, datt_, dy, W(o.wo), n, d_, qd, 0.0f));
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardWeightF32(Exec(), kDt, g + o.wo, dy, a.att, n, d_, qd));
    GPU_CHECK(cudaMemsetAsync(dq_, 0, nq * sizeof(T), stream_));
    GPU_CHECK(cudaMemsetAsync(dk_, 0, nk * sizeof(T), stream_));
    GPU_CHECK(cudaMemsetAsync(dv_, 0, nk * sizeof(T), stream_));
    const bool mixed = value_res_ && i >= 1;
    SATDAR_RETURN_IF_ERROR(kc::AttentionBackward(Exec(), kDt, dq_, dk_, dv_, datt_, a.att, a.lse,
                                                 a.q, a.k, mixed ? a.vmix : a.v, b_, t_, nh_, nkv_,
                                                 hs_));
    SATDAR_RETURN_IF_ERROR(kc::RopeBackward(Exec(), dq_, cos_, sin_, b_, t_, nh_, hs_));
    SATDAR_RETURN_IF_ERROR(kc::RopeBackward(Exec(), dk_, cos_, sin_, b_, t_, nkv_, hs_));
    if (c_.qk_norm) {
      GPU_CHECK(cudaMemsetAsync(dq_raw_, 0, nq * sizeof(T), stream_));
      GPU_CHECK(cudaMemsetAsync(dk_raw_, 0, nk * sizeof(T), stream_));
      SATDAR_RETURN_IF_ERROR(kc::RmsNormBackward(Exec(), dq_raw_, g + o.q_norm, dq_, a.q_raw,
                                                 W(o.q_norm), a.q_rstd, n * nh_, hs_));
      SATDAR_RETURN_IF_ERROR(kc::RmsNormBackward(Exec(), dk_raw_, g + o.k_norm, dk_, a.k_raw,
                                                 W(o.k_norm), a.k_rstd, n * nkv_, hs_));
    }
    const T* dv_proj = dv_;
    if (mixed && satformer_) {
      SATDAR_RETURN_IF_ERROR(ops::ValueMixBackward<T>(Exec(), dv_raw_, dv1_, dalpha_, dv_, v1_,
                                                      a.alpha, n, nkv_, hs_));
      SATDAR_RETURN_IF_ERROR(
          ops::ValueGateBackward<T>(Exec(), dxv, g + o.gate, dalpha_, xv, W(o.gate), n, nkv_, d_));
      dv_proj = dv_raw_;
    } else if (mixed) {
      const ResformerLambdas<float> grad = Resformer(i, g);
      SATDAR_RETURN_IF_ERROR(
          ops::ResformerMixBackward(Exec(), dv_raw_, dv1_, dv_, v1_, a.v, Resformer(i, master_),
                                    const_cast<float*>(grad.scale), const_cast<float*>(grad.logits),
                                    const_cast<float*>(grad.lambda2), static_cast<int64_t>(nk)));
      dv_proj = dv_raw_;
    } else if (value_res_ && i == 0) {
      // Layer 1's V is also V1: add the gradient every later layer sent it.
      SATDAR_RETURN_IF_ERROR(Add(Exec(), dv_raw_, dv_, dv1_, static_cast<int64_t>(nk)));
      dv_proj = dv_raw_;
    }
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardInput(Exec(), kDt, dxq, dq_raw_, W(o.wq), n, qd, d_, 1.0f));
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardInput(Exec(), kDt, dxk, dk_raw_, W(o.wk), n, kd, d_, 1.0f));
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardInput(Exec(), kDt, dxv, dv_proj, W(o.wv), n, kd, d_, 1.0f));
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardWeightF32(Exec(), kDt, g + o.wq, dq_raw_, xq, n, qd, d_));
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardWeightF32(Exec(), kDt, g + o.wk, dk_raw_, xk, n, kd, d_));
    SATDAR_RETURN_IF_ERROR(
        kc::MatmulBackwardWeightF32(Exec(), kDt, g + o.wv, dv_proj, xv, n, kd, d_));
    return absl::OkStatus();
  }

  // The execution context of the core and design ops: this decoder's stream, GEMM handle and
  // workspace.
  core::CudaExec Exec() { return {stream_, gemm_.get(), &workspace_}; }

  const ModelConfig c_;
  const GpuModelOptions o_;
  cudaStream_t stream_;
  kc::CachingAllocator* alloc_;
  ParamTable table_;
  const int sublayers_;
  const bool dar_, attnres_, denseformer_, hyper_residual_, muddformer_;
  const bool depth_;    // DAR or AttnRes: depth retrieval over a history of states
  const bool satformer_, resformer_;
  const bool value_res_;      // SATFormer or ResFormer: later layers read layer 1's V1
  const bool learnable_res_;  // ResFormer learnable_plus
  const int d_, nh_, nkv_, hs_, f_, v_;
  const float eps_;
  // This stream's scratch for the core ops, train_kernels (attention's delta, ...) and the
  // design ops (ResFormer's, SATFormer's, and the topologies', which get a pointer to it): the
  // workspace of Exec(); declared before the topologies
  // that hold a pointer to it, so it outlives them.
  kc::Workspace workspace_;
  std::unique_ptr<kc::GemmHandle> gemm_;
  std::vector<LayerOffsets> off_;
  int64_t embed_off_ = -1, norm_off_ = -1, head_off_ = -1;
  int64_t res_scale_off_ = -1, res_logits_off_ = -1;
  std::function<void(int)> hook_;
  std::unique_ptr<GpuMoe<T>> moe_;  // MoE FFNs (null: dense)
  std::unique_ptr<GpuDepthResidual<T>> depth_res_;  // DAR or AttnRes
  std::unique_ptr<GpuDenseFormer<T>> dense_;  // DenseFormer's topology (null: another)
  std::unique_ptr<GpuHyper<T>> hyper_;        // HC or mHC
  std::unique_ptr<GpuMuddFormer<T>> mudd_;    // MUDDFormer
  double* loss_acc_ = nullptr;      // the current Forward's loss (null while recomputing)
  double loss_scale_ = 1.0;

  DeviceArena arena_;  // (B, T) activations and scratch
  const float* master_ = nullptr;
  const T* w_ = nullptr;
  T* w_copy_ = nullptr;
  float* g_ = nullptr;
  bool forwarded_ = false;
  bool evaluating_ = false;  // inside Evaluate: no auxiliary losses
  int b_ = 0, t_ = 0;
  int32_t* pinned_ = nullptr;
  cudaEvent_t copied_ = nullptr;
  int32_t* inputs_ = nullptr;  // inputs (N) then targets (N)
  float *cos_ = nullptr, *sin_ = nullptr;
  std::vector<LayerActs> acts_;
  T *v1_ = nullptr, *dv1_ = nullptr;
  float* dalpha_ = nullptr;
  T *datt_ = nullptr, *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr, *dv_raw_ = nullptr;
  T *dq_raw_ = nullptr, *dk_raw_ = nullptr, *dx_ = nullptr, *dact_ = nullptr,
    *dgate_up_ = nullptr, *y_ = nullptr;
  T *h0_ = nullptr, *x_final_ = nullptr, *dx_final_ = nullptr, *lnf_ = nullptr,
    *lnf_grad_ = nullptr, *logits_ = nullptr;
  const T* dh0_ = nullptr;
  float *rstd_f_ = nullptr, *losses_ = nullptr;
  std::vector<T*> h_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuModel>> GpuModel::Create(const ModelConfig& config,
                                                          const GpuModelOptions& options,
                                                          CUstream_st* stream,
                                                          core::cuda::CachingAllocator* alloc) {
  SATDAR_RETURN_IF_ERROR(CheckGpuSupport(config));
  if (core::cuda::DeviceCount() == 0) {
    return absl::FailedPreconditionError("GpuModel: device cuda: no CUDA GPU on this machine");
  }
  if (alloc == nullptr) return absl::InvalidArgumentError("GpuModel: no allocator");
  if (options.compute != core::DType::kBF16 && options.compute != core::DType::kF32) {
    return absl::InvalidArgumentError("GpuModel: compute dtype must be bf16 or f32");
  }
  // The CPU model's table (the same parameters in the same order), aligned for the GPU.
  SATDAR_ASSIGN_OR_RETURN(ParamTable table, BuildParamTable(config, Sharding{}, kDeviceAlign));
  if (options.compute == core::DType::kF32) {
    auto m = std::make_unique<GpuDecoder<float>>(config, options, stream, alloc, std::move(table));
    SATDAR_RETURN_IF_ERROR(m->Init());
    return std::unique_ptr<GpuModel>(std::move(m));
  }
  auto m = std::make_unique<GpuDecoder<__nv_bfloat16>>(config, options, stream, alloc,
                                                       std::move(table));
  SATDAR_RETURN_IF_ERROR(m->Init());
  return std::unique_ptr<GpuModel>(std::move(m));
}

#endif  // SATDAR_WITH_CUDA

}  // namespace satdar::model::gpu
