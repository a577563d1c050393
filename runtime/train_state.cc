#include "runtime/train_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/ops/adamw.h"
#include "core/ops/ops.h"

namespace satdar::runtime {

namespace ops = ::satdar::core::ops;

template <class B>
TrainStateT<B>::TrainStateT(const model::ParamTable& table, std::vector<ZeroPartition> parts,
                            uint64_t seed, const typename B::Exec& x)
    : n_(table.size()), parts_(std::move(parts)), x_(x) {
  const int64_t len =
      parts_.size() == 1 && parts_[0].identity() ? std::max(n_, parts_[0].padded()) : n_;
  // The initial weights, computed on the host (in place on the CPU).
  std::vector<G> init;
  std::vector<G>* host = &init;
  if constexpr (!B::kDevice) host = &params_;
  host->assign(len, G(0));
  table.Initialize(host->data(), seed);
  status_ = model::Allocate<B>(x_, [&] {
    if constexpr (B::kDevice) params_.resize(len);
    grads_.assign(len, G(0));
    exp_avg_.assign(parts_.empty() ? n_ : 0, G(0));
    exp_avg_sq_.assign(parts_.empty() ? n_ : 0, G(0));
    for (const ZeroPartition& p : parts_) {
      m_shard_.emplace_back();
      m_shard_.back().assign(p.shard, G(0));
      v_shard_.emplace_back();
      v_shard_.back().assign(p.shard, G(0));
    }
  });
  if (!status_.ok()) return;
  if constexpr (B::kDevice) {
    for (const ZeroPartition& p : parts_) {
      std::vector<OwnedRun> runs;
      p.ForOwned([&](int64_t k, int64_t flat) {
        if (!runs.empty() && runs.back().k + runs.back().len == k &&
            runs.back().flat + runs.back().len == flat) {
          ++runs.back().len;
        } else {
          runs.push_back({k, flat, 1});
        }
      });
      owned_.push_back(std::move(runs));
    }
    status_ = ops::Upload(x_, params_.data(), init.data(), len);
    if (status_.ok()) status_ = ops::Synchronize(x_);
  }
}

template <class B>
OptimizerBuffers<typename TrainStateT<B>::G> TrainStateT<B>::buffers() {
  if constexpr (B::kDevice) {
    return {&host_params_, &host_m_, &host_v_};
  } else {
    return {&params_, &exp_avg_, &exp_avg_sq_};
  }
}

template <class B>
absl::StatusOr<CheckpointInfo> TrainStateT<B>::Load(const std::string& path,
                                                    const std::string& config_json,
                                                    bool weights_only,
                                                    const model::ParamTable& table) {
  SATDAR_RETURN_IF_ERROR(status_);
  // The whole moments on the host: on a device copies laid out as its buffers (the padding
  // past the table stays 0).
  std::vector<G>* m = &host_m_;
  std::vector<G>* v = &host_v_;
  if constexpr (B::kDevice) {
    host_params_.assign(n_, G(0));
    m->assign(n_, G(0));
    v->assign(n_, G(0));
  } else {
    m = &exp_avg_;
    v = &exp_avg_sq_;
    if (zero()) {
      m->assign(n_, G(0));
      v->assign(n_, G(0));
    }
  }
  OptimizerBuffers<G> into = buffers();
  if (weights_only) into.exp_avg = into.exp_avg_sq = nullptr;
  SATDAR_ASSIGN_OR_RETURN(CheckpointInfo info, LoadCheckpoint<G>(path, config_json, table, into));
  // This rank's shards of the moments (on a device gathered on the host, then uploaded).
  for (size_t q = 0; q < parts_.size(); ++q) {
    std::vector<G> ms(parts_[q].shard, G(0)), vs(parts_[q].shard, G(0));
    parts_[q].ForOwned([&](int64_t k, int64_t flat) {
      ms[k] = (*m)[flat];
      vs[k] = (*v)[flat];
    });
    SATDAR_RETURN_IF_ERROR(ops::Upload(x_, m_shard_[q].data(), ms.data(), parts_[q].shard));
    SATDAR_RETURN_IF_ERROR(ops::Upload(x_, v_shard_[q].data(), vs.data(), parts_[q].shard));
  }
  if constexpr (B::kDevice) {
    SATDAR_RETURN_IF_ERROR(ops::Upload(x_, params_.data(), host_params_.data(), n_));
    if (!zero()) {
      SATDAR_RETURN_IF_ERROR(ops::Upload(x_, exp_avg_.data(), m->data(), n_));
      SATDAR_RETURN_IF_ERROR(ops::Upload(x_, exp_avg_sq_.data(), v->data(), n_));
    }
    SATDAR_RETURN_IF_ERROR(ops::Synchronize(x_));  // the host copies may go now
  }
  ReleaseMoments();
  return info;
}

template <class B>
absl::Status TrainStateT<B>::GatherMoments(const comm::CollectiveOptions& o) {
  SATDAR_RETURN_IF_ERROR(status_);
  std::vector<G>* m = &host_m_;
  std::vector<G>* v = &host_v_;
  if constexpr (B::kDevice) {
    host_params_.assign(n_, G(0));
    SATDAR_RETURN_IF_ERROR(ops::Download(x_, host_params_.data(), params_.data(), n_));
    if (!zero()) {
      m->assign(n_, G(0));
      v->assign(n_, G(0));
      SATDAR_RETURN_IF_ERROR(ops::Download(x_, m->data(), exp_avg_.data(), n_));
      return ops::Download(x_, v->data(), exp_avg_sq_.data(), n_);
    }
  } else {
    if (!zero()) return absl::OkStatus();
    m = &exp_avg_;
    v = &exp_avg_sq_;
  }
  constexpr core::DType kDType = core::DTypeOf<G>::value;
  m->assign(n_, G(0));
  v->assign(n_, G(0));
  for (size_t q = 0; q < parts_.size(); ++q) {
    const ZeroPartition& p = parts_[q];
    Vec<G> packed;
    SATDAR_RETURN_IF_ERROR(model::Allocate<B>(x_, [&] { packed.resize(p.padded()); }));
    std::vector<G> host_packed;
    for (auto [shard, whole] : {std::pair{&m_shard_[q], m}, {&v_shard_[q], v}}) {
      const G* from = shard->data();
      if (p.group != nullptr) {
        SATDAR_RETURN_IF_ERROR(ops::Synchronize(x_));
        SATDAR_RETURN_IF_ERROR(
            p.group->AllGather(shard->data(), packed.data(), p.shard, kDType, o)->Wait());
        from = packed.data();
      }
      if constexpr (B::kDevice) {
        host_packed.resize(p.group != nullptr ? p.padded() : p.shard);
        SATDAR_RETURN_IF_ERROR(ops::Download(x_, host_packed.data(), from,
                                             static_cast<int64_t>(host_packed.size())));
        from = host_packed.data();
      }
      p.Unpack(from, whole->data());
    }
  }
  return absl::OkStatus();
}

template <class B>
void TrainStateT<B>::ReleaseMoments() {
  if constexpr (B::kDevice) {
    host_params_ = {};
    host_m_ = {};
    host_v_ = {};
  } else {
    if (!zero()) return;
    exp_avg_.clear();
    exp_avg_.shrink_to_fit();
    exp_avg_sq_.clear();
    exp_avg_sq_.shrink_to_fit();
  }
}

template <class B>
absl::Status TrainStateT<B>::Update(const core::AdamWParams& hp, const Vec<G>& shard,
                                    core::ThreadPool* pool, const comm::CollectiveOptions& o) {
  SATDAR_RETURN_IF_ERROR(status_);
  if (!zero()) {
    if constexpr (B::kDevice) {
      (void)pool;
      return ops::AdamWUpdate(x_, params_.data(), grads_.data(), exp_avg_.data(),
                              exp_avg_sq_.data(), n_, hp);
    } else {
      core::cpu::AdamWUpdate(params_.data(), grads_.data(), exp_avg_.data(), exp_avg_sq_.data(),
                             n_, hp, pool);
      return absl::OkStatus();
    }
  }
  if constexpr (B::kDevice) {
    int64_t at = 0;
    for (size_t q = 0; q < parts_.size(); ++q) {
      const ZeroPartition& p = parts_[q];
      if (p.identity()) {
        // This rank's slice of the (padded) buffer, updated in place; then every replica's
        // slice reaches every replica (slice r sits at r * shard).
        SATDAR_RETURN_IF_ERROR(ops::AdamWUpdate(x_, params_.data() + p.lo(), shard.data() + at,
                                                m_shard_[q].data(), v_shard_[q].data(),
                                                p.shard, hp));
        at += p.shard;
        if (p.group == nullptr) continue;
        SATDAR_RETURN_IF_ERROR(ops::Synchronize(x_));
        SATDAR_RETURN_IF_ERROR(p.group->AllGather(params_.data() + p.lo(), params_.data(),
                                                  p.shard, core::DTypeOf<G>::value, o)
                                   ->Wait());
        continue;
      }
      // Packed: this rank's owned elements into a shard, updated, gathered over the group
      // (or alone written back), then unpacked into the flat buffer.
      Vec<G> mine, packed;
      SATDAR_RETURN_IF_ERROR(model::Allocate<B>(x_, [&] {
        mine.assign(p.shard, G(0));  // the padding past the partition's end stays 0
        packed.resize(p.group != nullptr ? p.padded() : 0);
      }));
      for (const OwnedRun& r : owned_[q]) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, mine.data() + r.k, params_.data() + r.flat, r.len));
      }
      SATDAR_RETURN_IF_ERROR(ops::AdamWUpdate(x_, mine.data(), shard.data() + at,
                                              m_shard_[q].data(), v_shard_[q].data(), p.shard,
                                              hp));
      at += p.shard;
      if (p.group == nullptr) {
        for (const OwnedRun& r : owned_[q]) {
          SATDAR_RETURN_IF_ERROR(
              ops::Copy(x_, params_.data() + r.flat, mine.data() + r.k, r.len));
        }
        continue;
      }
      SATDAR_RETURN_IF_ERROR(ops::Synchronize(x_));
      SATDAR_RETURN_IF_ERROR(p.group->AllGather(mine.data(), packed.data(), p.shard,
                                                core::DTypeOf<G>::value, o)
                                 ->Wait());
      int64_t k = 0;
      for (const auto& [off, len] : p.runs) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, params_.data() + off, packed.data() + k, len));
        k += len;
      }
    }
    return absl::OkStatus();
  } else {
    // Update this rank's shard of each partition, then its group gathers the partition.
    int64_t at = 0;
    for (size_t q = 0; q < parts_.size(); ++q) {
      const ZeroPartition& p = parts_[q];
      std::vector<G> mine(p.shard, G(0));  // the padding past the partition's end stays 0
      p.ForOwned([&](int64_t k, int64_t flat) { mine[k] = params_[flat]; });
      core::cpu::AdamWUpdate(mine.data(), shard.data() + at, m_shard_[q].data(),
                             v_shard_[q].data(), p.shard, hp, pool);
      at += p.shard;
      if (p.group == nullptr) {
        p.Unpack(mine.data(), params_.data());
        continue;
      }
      std::vector<G> packed(p.identity() ? 0 : p.padded());
      G* into = p.identity() ? params_.data() : packed.data();  // params_ is padded() long
      SATDAR_RETURN_IF_ERROR(
          p.group->AllGather(mine.data(), into, p.shard, core::DTypeOf<G>::value, o)->Wait());
      if (!p.identity()) p.Unpack(packed.data(), params_.data());
    }
    return absl::OkStatus();
  }
}

template class TrainStateT<model::Cpu<float>>;
template class TrainStateT<model::Cpu<double>>;
#if defined(SATDAR_WITH_CUDA)
template class TrainStateT<model::Cuda<float>>;
#endif

}  // namespace satdar::runtime
