// The 1F1B schedule (plain and interleaved) over stand-in stages that check what reaches them:
// each boundary tensor is stamped with its micro-batch, virtual stage, tensor and element, so
// a message delivered to the wrong chunk, micro-batch or direction fails the receiving stage.
// The ranks are threads over the in-process communicator, wrapped so that point-to-point
// messages match in issue order whatever their tags, as NCCL's do.
#include "parallel/pipeline.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/local_communicator.h"
#include "core/check.h"
#include "gtest/gtest.h"

namespace satdar::parallel {
namespace {

// NCCL's matching: every Send and Recv carries tag 0, so messages between two ranks pair up
// in the order they were issued.
class TagBlind : public comm::Communicator {
 public:
  explicit TagBlind(std::unique_ptr<comm::Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::unique_ptr<comm::Work> AllReduce(void* d, size_t n, core::DType t, comm::ReduceOp op,
                                        const comm::CollectiveOptions& o) override {
    return inner_->AllReduce(d, n, t, op, o);
  }
  std::unique_ptr<comm::Work> ReduceScatter(const void* in, void* out, size_t n, core::DType t,
                                            comm::ReduceOp op,
                                            const comm::CollectiveOptions& o) override {
    return inner_->ReduceScatter(in, out, n, t, op, o);
  }
  std::unique_ptr<comm::Work> AllGather(const void* in, void* out, size_t n, core::DType t,
                                        const comm::CollectiveOptions& o) override {
    return inner_->AllGather(in, out, n, t, o);
  }
  std::unique_ptr<comm::Work> Broadcast(void* d, size_t n, core::DType t, int root,
                                        const comm::CollectiveOptions& o) override {
    return inner_->Broadcast(d, n, t, root, o);
  }
  std::unique_ptr<comm::Work> AllToAllV(const void* in, const std::vector<size_t>& sc, void* out,
                                        const std::vector<size_t>& rc, core::DType t,
                                        const comm::CollectiveOptions& o) override {
    return inner_->AllToAllV(in, sc, out, rc, t, o);
  }
  std::unique_ptr<comm::Work> Send(const void* d, size_t n, core::DType t, int peer, int tag,
                                   const comm::CollectiveOptions& o) override {
    (void)tag;
    return inner_->Send(d, n, t, peer, 0, o);
  }
  std::unique_ptr<comm::Work> Recv(void* d, size_t n, core::DType t, int peer, int tag,
                                   const comm::CollectiveOptions& o) override {
    (void)tag;
    return inner_->Recv(d, n, t, peer, 0, o);
  }
  std::unique_ptr<comm::Work> Barrier(const comm::CollectiveOptions& o) override {
    return inner_->Barrier(o);
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Split(
      int color, int key, const comm::CollectiveOptions& o) override {
    // Its parts ignore tags too (the links of MakePipelineLinks are such parts).
    SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> part,
                            inner_->Split(color, key, o));
    return std::unique_ptr<comm::Communicator>(std::make_unique<TagBlind>(std::move(part)));
  }

 private:
  std::unique_ptr<comm::Communicator> inner_;
};

// What virtual stage vs sends forward (kind 0) or back (kind 1) for micro-batch mb: exact in
// float for the sizes here.
float Stamp(int kind, int mb, int vs, int tensor, int i) {
  return (kind == 0 ? 1.0f : -1.0f) * (mb * 10000 + vs * 100 + tensor * 10 + i + 1);
}

// A stage of virtual stage vs of `stages` in all: 2 boundary tensors of b * t floats each way.
// Forward and Evaluate return 100 * (vs + 1) + mb; the step's calls go to *log.
class StampStage : public PipelineStage {
 public:
  StampStage(int vs, int stages, int m, std::vector<std::string>* log)
      : vs_(vs), stages_(stages), m_(m), log_(log) {}

  absl::StatusOr<model::StageViews> Prepare(int b, int t) override {
    if (fail_prepare_) return absl::ResourceExhaustedError("no memory for the boundary");
    // As the models' PrepareStage: sized once for (b, t), the contents kept afterwards.
    const size_t n = static_cast<size_t>(b) * t;
    auto size = [n](std::vector<std::vector<float>>* v) {
      v->resize(2);
      for (auto& x : *v) x.resize(n);
    };
    if (vs_ > 0) {
      size(&in_);
      size(&din_);
    }
    if (vs_ + 1 < stages_) {
      size(&out_);
      size(&dout_);
    }
    model::StageViews v;
    v.dtype = core::DType::kF32;
    auto view = [](std::vector<std::vector<float>>& from, std::vector<model::BoundaryView>* to) {
      for (auto& x : from) to->push_back({x.data(), x.size()});
    };
    view(in_, &v.in);
    view(out_, &v.out);
    view(dout_, &v.dout);
    view(din_, &v.din);
    return v;
  }
  absl::StatusOr<double> Forward(const int32_t* tokens, int b, int t, double scale) override {
    if (scale != 1.0 / m_) return absl::InternalError(absl::StrCat("forward scale ", scale));
    SATDAR_ASSIGN_OR_RETURN(double v, Pass(tokens, b, t));
    log_->push_back(absl::StrCat("F", vs_, ".", mb_));
    return v;
  }
  absl::StatusOr<double> Evaluate(const int32_t* tokens, int b, int t) override {
    SATDAR_ASSIGN_OR_RETURN(double v, Pass(tokens, b, t));
    log_->push_back(absl::StrCat("E", vs_, ".", mb_));
    return v;
  }
  absl::Status Backward(double scale) override {
    if (scale != 1.0 / m_) return absl::InternalError(absl::StrCat("backward scale ", scale));
    SATDAR_RETURN_IF_ERROR(Check(dout_, 1, vs_ + 1));
    for (size_t k = 0; k < din_.size(); ++k) {
      for (size_t i = 0; i < din_[k].size(); ++i) din_[k][i] = Stamp(1, mb_, vs_, k, i);
    }
    log_->push_back(absl::StrCat("B", vs_, ".", mb_));
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  bool fail_prepare_ = false;

 private:
  absl::StatusOr<double> Pass(const int32_t* tokens, int b, int t) {
    (void)b, (void)t;
    mb_ = tokens[0];
    SATDAR_RETURN_IF_ERROR(Check(in_, 0, vs_ - 1));
    for (size_t k = 0; k < out_.size(); ++k) {
      for (size_t i = 0; i < out_[k].size(); ++i) out_[k][i] = Stamp(0, mb_, vs_, k, i);
    }
    return 100.0 * (vs_ + 1) + mb_;
  }
  // Every element of `got` is what virtual stage `from` stamped for this micro-batch.
  absl::Status Check(const std::vector<std::vector<float>>& got, int kind, int from) const {
    for (size_t k = 0; k < got.size(); ++k) {
      for (size_t i = 0; i < got[k].size(); ++i) {
        if (got[k][i] != Stamp(kind, mb_, from, k, i)) {
          return absl::InternalError(absl::StrCat(
              "virtual stage ", vs_, " micro-batch ", mb_, ": ", kind == 0 ? "input" : "gradient",
              " tensor ", k, "[", i, "] is ", got[k][i], ", stage ", from, " sent ",
              Stamp(kind, mb_, from, k, i)));
        }
      }
    }
    return absl::OkStatus();
  }

  const int vs_, stages_, m_;
  std::vector<std::string>* log_;
  int mb_ = -1;
  std::vector<std::vector<float>> in_, out_, dout_, din_;
};

struct RankResult {
  absl::Status status;
  double sum = 0;
  std::vector<std::string> log;
  std::vector<std::pair<int64_t, int64_t>> boundaries;
};

// p ranks (threads) of v chunks each run Step (or ForwardOnly) over m micro-batches of 1 x 3,
// over one tag-blind communicator or (links) over MakePipelineLinks of it.
std::vector<RankResult> RunPipeline(int p, int v, int m, bool forward_only, int fail_stage = -1,
                                    bool links = false) {
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  for (auto& c : comm::MakeLocalCommunicators(p)) {
    comms.push_back(std::make_unique<TagBlind>(std::move(c)));
  }
  std::vector<std::vector<int32_t>> tokens(m);
  for (int mb = 0; mb < m; ++mb) tokens[mb] = {mb, 0, 0, 0};
  std::vector<RankResult> out(p);
  std::vector<std::thread> threads;
  for (int s = 0; s < p; ++s) {
    threads.emplace_back([&, s] {
      RankResult& r = out[s];
      std::vector<std::unique_ptr<StampStage>> owned;
      std::vector<std::vector<PipelineStage*>> chunks(v);
      for (int c = 0; c < v; ++c) {
        for (int i = 0; i < PipelineSlots(p, s, v, m); ++i) {
          owned.push_back(std::make_unique<StampStage>(c * p + s, p * v, m, &r.log));
          owned.back()->fail_prepare_ = c * p + s == fail_stage;
          chunks[c].push_back(owned.back().get());
        }
      }
      comm::CollectiveOptions o;
      o.timeout = absl::Seconds(fail_stage >= 0 ? 2 : 60);
      std::unique_ptr<PipelineSchedule> made;
      if (links) {
        double probe = 0;
        absl::StatusOr<PipelineLinks> l = MakePipelineLinks(comms[s].get(), o, &probe);
        r.status = l.status();
        if (!l.ok()) return;
        made = std::make_unique<PipelineSchedule>(*std::move(l), s, p, chunks, o);
      } else {
        made = std::make_unique<PipelineSchedule>(comms[s].get(), chunks, o);
      }
      PipelineSchedule& pipe = *made;
      auto tokens_of = [&](int mb) { return tokens[mb].data(); };
      absl::StatusOr<double> sum =
          forward_only ? pipe.ForwardOnly(tokens_of, m, 1, 3) : pipe.Step(tokens_of, m, 1, 3);
      r.status = sum.status();
      if (!sum.ok()) return;
      r.sum = *sum;
      if (forward_only) return;
      absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> b =
          BoundaryBytes(pipe, comms[s].get(), o);
      r.status = b.status();
      if (b.ok()) r.boundaries = *b;
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// Runs one Step of the layout and checks every rank: each message reached the chunk and
// micro-batch it was meant for (StampStage checks), every forward and backward ran once, each
// backward after its forward, and the step summed what the stages returned.
void CheckStep(int p, int v, int m, bool links) {
  SCOPED_TRACE(absl::StrCat(p, " stages x ", v, " virtual, ", m, " micro-batches",
                            links ? ", over links" : ""));
  const std::vector<RankResult> ranks =
      RunPipeline(p, v, m, /*forward_only=*/false, /*fail_stage=*/-1, links);
  for (int s = 0; s < p; ++s) {
    const RankResult& r = ranks[s];
    ASSERT_TRUE(r.status.ok()) << "stage " << s << ": " << r.status;
    double want = 0;
    std::set<std::string> forwards, backwards;
    for (int c = 0; c < v; ++c) {
      for (int mb = 0; mb < m; ++mb) want += 100.0 * (c * p + s + 1) + mb;
    }
    EXPECT_EQ(r.sum, want);
    ASSERT_EQ(r.log.size(), static_cast<size_t>(2 * v * m));
    for (const std::string& e : r.log) {
      const std::string what = e.substr(1);
      if (e[0] == 'F') {
        EXPECT_TRUE(forwards.insert(what).second) << "forward twice: " << e;
      } else {
        EXPECT_TRUE(forwards.count(what)) << "backward before its forward: " << e;
        EXPECT_TRUE(backwards.insert(what).second) << "backward twice: " << e;
      }
    }
    // Each of the p*v - 1 boundaries carried m micro-batches of 2 tensors of 3 floats each way.
    ASSERT_EQ(r.boundaries.size(), static_cast<size_t>(p * v - 1));
    for (const auto& [fwd, bwd] : r.boundaries) {
      EXPECT_EQ(fwd, m * 2 * 3 * 4);
      EXPECT_EQ(bwd, m * 2 * 3 * 4);
    }
  }
}

// Every layout of up to 4 stages, 4 virtual stages and 16 micro-batches over one communicator
// that ignores tags.
TEST(PipelineScheduleTest, MessagesArriveInIssueOrderWithoutTags) {
  for (int p = 2; p <= 4; ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int m = 1; m <= 16; ++m) {
        if (v > 1 && m % p != 0) continue;  // the interleaved schedule's rule
        CheckStep(p, v, m, /*links=*/false);
      }
    }
  }
}

// The same over directed links (one communicator per direction between two stages, as a
// device pipeline runs), 5 stages included (6 splits: an odd ring).
TEST(PipelineScheduleTest, OverLinks) {
  for (int p = 2; p <= 5; ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int m = 1; m <= 16; ++m) {
        if (v > 1 && m % p != 0) continue;
        CheckStep(p, v, m, /*links=*/true);
      }
    }
  }
}

// Validation: groups of p micro-batches through the chunks (the last group may be short).
TEST(PipelineScheduleTest, ForwardOnlyRunsEveryMicroBatchThroughEveryChunk) {
  for (const auto& [p, v, m] : std::vector<std::tuple<int, int, int>>{
           {2, 1, 5}, {2, 2, 5}, {3, 2, 7}, {4, 3, 9}, {4, 1, 1}}) {
    SCOPED_TRACE(absl::StrCat(p, " stages x ", v, " virtual, ", m, " micro-batches"));
    for (const bool links : {false, true}) {
      const std::vector<RankResult> ranks =
          RunPipeline(p, v, m, /*forward_only=*/true, /*fail_stage=*/-1, links);
      for (int s = 0; s < p; ++s) {
        ASSERT_TRUE(ranks[s].status.ok()) << "stage " << s << ": " << ranks[s].status;
        EXPECT_EQ(ranks[s].log.size(), static_cast<size_t>(v * m));
        double want = 0;
        for (int c = 0; c < v; ++c) {
          for (int mb = 0; mb < m; ++mb) want += 100.0 * (c * p + s + 1) + mb;
        }
        EXPECT_EQ(ranks[s].sum, want);
      }
    }
  }
}

// Each link joins the right two stages, the sender first.
TEST(PipelineScheduleTest, LinksJoinNeighboursSenderFirst) {
  for (int p = 2; p <= 5; ++p) {
    std::vector<std::unique_ptr<comm::Communicator>> comms = comm::MakeLocalCommunicators(p);
    std::vector<absl::StatusOr<PipelineLinks>> links(p);
    std::vector<std::thread> threads;
    for (int s = 0; s < p; ++s) {
      threads.emplace_back([&, s] {
        double probe = s;  // each link carries its sender's once
        links[s] = MakePipelineLinks(comms[s].get(), {}, &probe);
      });
    }
    for (auto& t : threads) t.join();
    for (int s = 0; s < p; ++s) {
      ASSERT_TRUE(links[s].ok()) << links[s].status();
      const PipelineLinks& l = *links[s];
      for (const comm::Communicator* c : {l.to_next.get(), l.to_prev.get()}) {
        EXPECT_EQ(c->size(), 2);
        EXPECT_EQ(c->rank(), 0) << "stage " << s << " sends as rank 0";
      }
      for (const comm::Communicator* c : {l.from_prev.get(), l.from_next.get()}) {
        EXPECT_EQ(c->size(), 2);
        EXPECT_EQ(c->rank(), 1) << "stage " << s << " receives as rank 1";
      }
    }
  }
  std::vector<std::unique_ptr<comm::Communicator>> one = comm::MakeLocalCommunicators(1);
  EXPECT_EQ(MakePipelineLinks(one[0].get(), {}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A stage whose boundary buffers cannot be sized fails the step with its error, naming the
// virtual stage and micro-batch; the stages waiting on it time out.
TEST(PipelineScheduleTest, AFailedPrepareNamesTheStage) {
  const std::vector<RankResult> ranks =
      RunPipeline(2, 2, 2, /*forward_only=*/false, /*fail_stage=*/2);
  EXPECT_EQ(ranks[0].status.code(), absl::StatusCode::kResourceExhausted) << ranks[0].status;
  EXPECT_NE(ranks[0].status.message().find("pipeline stage 2 micro-batch 0: no memory"),
            std::string::npos)
      << ranks[0].status;
  EXPECT_EQ(ranks[1].status.code(), absl::StatusCode::kDeadlineExceeded) << ranks[1].status;
}

}  // namespace
}  // namespace satdar::parallel
