#include "runtime/analysis.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/ops/gemm.h"
#include "core/random.h"
#include "core/thread_pool.h"
#include "runtime/cka.h"
#include "runtime/weights.h"

namespace satdar::runtime {

const char* Name(Corruption c) { return c == Corruption::kSwap ? "swap" : "random"; }
const char* Name(Scored s) { return s == Scored::kAll ? "all" : "after"; }

namespace {

// A model with its weights and the held-out batches, in T.
template <typename T>
struct Loaded {
  std::unique_ptr<core::ThreadPool> pool;
  std::unique_ptr<model::Model<T>> model;
  std::vector<T> params;
  HeldOut held_out;
  int64_t sequences = 0;
  int batches = 0;
};

template <typename T>
absl::StatusOr<Loaded<T>> Load(const AnalysisOptions& o, const char* command) {
  const EvalOptions& e = o.eval;
  Loaded<T> l;
  core::cpu::InitBlas();
  l.pool = std::make_unique<core::ThreadPool>(e.threads);
  SATDAR_ASSIGN_OR_RETURN(l.model, model::CreateModel<T>(e.config, l.pool.get()));
  if (l.model->ResidualStreams() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: residual \"", model::Name(e.config.residual), "\" keeps one residual stream; ",
        command, " compares the streams of \"dar\", \"hc\" and \"mhc\""));
  }
  SATDAR_RETURN_IF_ERROR(LoadModelWeights<T>(e.weights, o.checkpoint, l.model->params(),
                                             model::ModelConfigToJson(e.config), &l.params));
  SATDAR_ASSIGN_OR_RETURN(l.held_out, OpenHeldOut(e));
  l.sequences = l.held_out.Sequences(e);
  l.batches = static_cast<int>((l.sequences + e.batch_size - 1) / e.batch_size);
  return l;
}

// The sequences of batch i (count of them) into tokens (count, T+1).
template <typename T>
int ReadBatch(const Loaded<T>& l, const EvalOptions& e, int i, std::vector<int32_t>* tokens) {
  const int64_t first = static_cast<int64_t>(i) * e.batch_size;
  const int count = static_cast<int>(std::min<int64_t>(e.batch_size, l.sequences - first));
  tokens->resize(static_cast<size_t>(count) * (e.seq_len + 1));
  l.held_out.source->Batch(kEvalFirstStep + i, 0, first, count, e.seq_len, tokens->data());
  return count;
}

std::string Label(const model::ModelConfig& c) {
  std::string label = model::Name(c.residual);
  if (c.residual == model::Residual::kDar) {
    absl::StrAppend(&label, "/", model::Name(c.dar_variant), " block ",
                    c.block_size > 0 ? c.block_size : 2);
  } else {
    absl::StrAppend(&label, " ", c.hc_streams, " streams");
  }
  if (c.value_residual != model::ValueResidualKind::kNone) {
    absl::StrAppend(&label, " + ", model::Name(c.value_residual));
  }
  if (c.moe.has_value()) absl::StrAppend(&label, " + moe");
  return label;
}

nlohmann::json Common(const AnalysisOptions& o, const char* command, int streams) {
  nlohmann::json j;
  j["command"] = command;
  j["design"] = model::DesignName(o.eval.config);
  j["label"] = Label(o.eval.config);
  j["streams"] = streams;
  return j;
}

template <typename T>
absl::StatusOr<nlohmann::json> CkaTyped(const AnalysisOptions& o, CkaStates* out) {
  const EvalOptions& e = o.eval;
  SATDAR_ASSIGN_OR_RETURN(Loaded<T> l, Load<T>(o, "analyze cka"));
  const int d = e.config.hidden_size;
  std::vector<model::DepthState> all, batch;
  std::vector<int32_t> tokens;
  int64_t rows = 0;
  for (int i = 0; i < l.batches; ++i) {
    const int count = ReadBatch(l, e, i, &tokens);
    SATDAR_RETURN_IF_ERROR(
        l.model->Forward(l.params.data(), tokens.data(), count, e.seq_len).status());
    SATDAR_RETURN_IF_ERROR(l.model->DepthStates(&batch));
    if (all.empty()) {
      all = std::move(batch);
    } else {
      SATDAR_CHECK(batch.size() == all.size()) << "depth states changed between batches";
      for (size_t s = 0; s < all.size(); ++s) {
        all[s].values.insert(all[s].values.end(), batch[s].values.begin(), batch[s].values.end());
      }
    }
    rows += static_cast<int64_t>(count) * e.seq_len;
  }
  const int streams = l.model->ResidualStreams();
  // Each stream's states in depth order.
  std::vector<std::vector<const double*>> by_stream(streams);
  std::vector<int> layers;
  nlohmann::json listed = nlohmann::json::array();
  for (const model::DepthState& s : all) {
    by_stream[s.stream].push_back(s.values.data());
    if (s.stream == 0) layers.push_back(s.sublayer / 2);
    listed.push_back({{"stream", s.stream}, {"depth", s.depth}, {"sublayer", s.sublayer}});
  }
  nlohmann::json result = Common(o, "cka", streams);
  result["depths"] = layers;
  result["states"] = listed;
  nlohmann::json matrices = nlohmann::json::object();
  double unpaired = 0, paired = 0, high = 0;
  int64_t unpaired_n = 0, paired_n = 0;
  const int depths = static_cast<int>(layers.size());
  for (int a = 0; a < streams; ++a) {
    for (int b = a; b < streams; ++b) {
      const std::vector<double> m = CkaMatrix(by_stream[a], by_stream[b], rows, d);
      nlohmann::json rows_json = nlohmann::json::array();
      for (int i = 0; i < depths; ++i) {
        nlohmann::json row = nlohmann::json::array();
        for (int j = 0; j < depths; ++j) {
          const double v = m[static_cast<size_t>(i) * depths + j];
          row.push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr));
          if (a == b || i == 0 || j == 0 || !std::isfinite(v)) continue;
          if (i == j) {
            paired += v;
            ++paired_n;
          } else {
            unpaired += v;
            high += v >= o.cka_threshold ? 1 : 0;
            ++unpaired_n;
          }
        }
        rows_json.push_back(row);
      }
      matrices[absl::StrCat("s", a, "-s", b)] = rows_json;
    }
  }
  result["matrices"] = matrices;
  auto mean = [](double sum, int64_t n) {
    return n > 0 ? nlohmann::json(sum / n) : nlohmann::json(nullptr);
  };
  result["summary"] = {{"mean_unpaired_cross", mean(unpaired, unpaired_n)},
                       {"mean_paired_cross", mean(paired, paired_n)},
                       {"high_cross_fraction", mean(high, unpaired_n)},
                       {"threshold", o.cka_threshold}};
  result["tokens"] = rows;
  result["sequences"] = l.sequences;
  if (out != nullptr) {
    out->n = static_cast<int>(rows);
    out->d = d;
    out->states = std::move(all);
  }
  return result;
}

// The corrupted copy of tokens (count, T+1): the first `span` input positions of every
// sequence replaced; the targets after the span are untouched (position t's target is t+1).
std::vector<int32_t> Corrupt(const std::vector<int32_t>& tokens, int count, int t, int span,
                             const AnalysisOptions& o, int batch) {
  std::vector<int32_t> c = tokens;
  const int row = t + 1;
  for (int b = 0; b < count; ++b) {
    for (int p = 0; p < span; ++p) {
      if (o.corruption == Corruption::kSwap) {
        c[b * row + p] = tokens[((b + 1) % count) * row + p];
      } else {
        const uint64_t index = (static_cast<uint64_t>(batch) * 4096 + b) * row + p;
        c[b * row + p] = static_cast<int32_t>(core::RandomBits(o.eval.seed, 0x72657363ull, index) %
                                              static_cast<uint64_t>(o.eval.config.vocab_size));
      }
    }
  }
  return c;
}

template <typename T>
absl::StatusOr<nlohmann::json> RescueTyped(const AnalysisOptions& o) {
  const EvalOptions& e = o.eval;
  const int layers = e.config.num_hidden_layers;
  std::vector<int> at_layers = o.layers;
  if (at_layers.empty()) {
    for (int k = 1; k < layers; ++k) at_layers.push_back(k);
  }
  for (int k : at_layers) {
    if (k < 1 || k >= layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layers: ", k, " is not between two layers of the model (1 .. ", layers - 1, ")"));
    }
  }
  if (o.corrupt_fraction <= 0 || o.corrupt_fraction >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("corrupt_fraction: ", o.corrupt_fraction, " is not in (0, 1)"));
  }
  const int span = static_cast<int>(std::ceil(o.corrupt_fraction * e.seq_len));
  if (span >= e.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("corrupt_fraction: ", o.corrupt_fraction,
                                                   " of seq_len ", e.seq_len,
                                                   " leaves no position to score"));
  }
  SATDAR_ASSIGN_OR_RETURN(Loaded<T> l, Load<T>(o, "analyze rescue"));
  if (o.corruption == Corruption::kSwap && e.batch_size < 2) {
    return absl::InvalidArgumentError(
        "batch_size: the swap corruption takes the span from another sequence of the batch; "
        "give 2 or more");
  }
  const int streams = l.model->ResidualStreams();
  // Conditions: 0 neither, 1..streams one stream, streams+1 both (every tensor).
  const int conditions = streams + 2;
  auto condition_name = [&](int c) {
    if (c == 0) return std::string("neither");
    if (c == conditions - 1) return std::string("both");
    return absl::StrCat("s", c - 1);
  };
  // The positions scored: all, or those after the span (clean inputs, corrupted context).
  const int first_scored = o.scored == Scored::kAll ? 0 : span;
  // Sums of the scored positions' losses per (depth, condition), and of clean / corrupted.
  std::vector<double> sums(at_layers.size() * conditions, 0.0);
  double clean_sum = 0, corrupted_sum = 0;
  int64_t scored = 0;
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> clean, corrupted, mixed;
  std::vector<int> owner, owner_corrupted;
  std::vector<double> losses;
  auto scored_sum = [&](int count) {
    double s = 0;
    for (int b = 0; b < count; ++b) {
      for (int p = first_scored; p < e.seq_len; ++p) {
        s += losses[static_cast<size_t>(b) * e.seq_len + p];
      }
    }
    return s;
  };
  for (int i = 0; i < l.batches; ++i) {
    const int count = ReadBatch(l, e, i, &tokens);
    if (o.corruption == Corruption::kSwap && count < 2) continue;  // a last batch of one
    const std::vector<int32_t> bad = Corrupt(tokens, count, e.seq_len, span, o, i);
    scored += static_cast<int64_t>(count) * (e.seq_len - first_scored);
    double batch_clean = 0, batch_corrupted = 0;
    for (size_t k = 0; k < at_layers.size(); ++k) {
      const int at = 2 * at_layers[k];
      model::Model<T>* m = l.model.get();
      SATDAR_RETURN_IF_ERROR(
          m->ForwardToState(l.params.data(), tokens.data(), count, e.seq_len, at, &clean, &owner));
      SATDAR_RETURN_IF_ERROR(m->ForwardToState(l.params.data(), bad.data(), count, e.seq_len, at,
                                               &corrupted, &owner_corrupted));
      for (int c = 0; c < conditions; ++c) {
        // Neither and both are the corrupted and the clean run whatever the depth: run once.
        if (k > 0 && (c == 0 || c == conditions - 1)) {
          sums[k * conditions + c] += c == 0 ? batch_corrupted : batch_clean;
          continue;
        }
        mixed = corrupted;
        for (size_t t = 0; t < mixed.size(); ++t) {
          const bool restore = c == conditions - 1 || (c > 0 && owner[t] == c - 1);
          if (restore) mixed[t] = clean[t];
        }
        // The clean targets whatever the inputs were.
        SATDAR_RETURN_IF_ERROR(m->ForwardFromState(l.params.data(), tokens.data(), count,
                                                   e.seq_len, at, mixed, &losses)
                                   .status());
        const double s = scored_sum(count);
        sums[k * conditions + c] += s;
        if (k == 0 && c == 0) batch_corrupted = s;
        if (k == 0 && c == conditions - 1) batch_clean = s;
      }
    }
    corrupted_sum += batch_corrupted;
    clean_sum += batch_clean;
  }
  if (scored == 0) {
    return absl::InvalidArgumentError("batch_size: no batch of 2 or more sequences to swap");
  }
  const double clean_loss = clean_sum / scored, corrupted_loss = corrupted_sum / scored;
  const double gap = corrupted_loss - clean_loss;
  if (!(std::fabs(gap) > 1e-9 * std::max(1.0, std::fabs(clean_loss)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "corruption: the corrupted loss ", corrupted_loss, " equals the clean loss ", clean_loss,
        " on these weights and batches; the gain (a fraction of their gap) is undefined"));
  }
  nlohmann::json result = Common(o, "rescue", streams);
  result["corruption"] = Name(o.corruption);
  result["corrupt_fraction"] = o.corrupt_fraction;
  result["corrupted_positions"] = span;
  result["scored"] = Name(o.scored);
  result["scored_positions"] = e.seq_len - first_scored;
  result["clean_loss"] = clean_loss;
  result["corrupted_loss"] = corrupted_loss;
  // Negative when the corruption helps (an untrained model, or a context that misleads it):
  // the gains are then fractions of a gap of the other sign.
  result["gap"] = gap;
  nlohmann::json depths = nlohmann::json::array();
  std::vector<double> mean_gain(conditions, 0.0);
  double asymmetry = 0;
  for (size_t k = 0; k < at_layers.size(); ++k) {
    nlohmann::json loss = nlohmann::json::object(), gain = nlohmann::json::object();
    std::vector<double> g(conditions);
    for (int c = 0; c < conditions; ++c) {
      const double lc = sums[k * conditions + c] / scored;
      g[c] = (corrupted_loss - lc) / gap;
      loss[condition_name(c)] = lc;
      gain[condition_name(c)] = g[c];
      mean_gain[c] += g[c] / at_layers.size();
    }
    if (streams == 2) asymmetry += std::fabs(g[1] - g[2]) / at_layers.size();
    depths.push_back({{"layer", at_layers[k]}, {"loss", loss}, {"gain", gain}});
  }
  result["depths"] = depths;
  nlohmann::json mean = nlohmann::json::object();
  for (int c = 0; c < conditions; ++c) mean[condition_name(c)] = mean_gain[c];
  result["summary"] = {{"mean_gain", mean},
                       {"asymmetry", streams == 2 ? nlohmann::json(asymmetry) : nlohmann::json(nullptr)}};
  result["sequences"] = l.sequences;
  result["scored_tokens"] = scored;
  return result;
}

}  // namespace

absl::StatusOr<nlohmann::json> AnalyzeCka(const AnalysisOptions& o, CkaStates* states) {
  return o.eval.f64 ? CkaTyped<double>(o, states) : CkaTyped<float>(o, states);
}

absl::StatusOr<nlohmann::json> AnalyzeRescue(const AnalysisOptions& o) {
  return o.eval.f64 ? RescueTyped<double>(o) : RescueTyped<float>(o);
}

absl::Status WriteStatesNpy(const std::string& path, const CkaStates& s) {
  // NumPy format 1.0: magic, version, header length (little-endian u16), a Python dict literal
  // padded with spaces to a multiple of 64 bytes with a final newline, then the data.
  std::string header = absl::StrCat("{'descr': '<f8', 'fortran_order': False, 'shape': (",
                                     s.states.size(), ", ", s.n, ", ", s.d, "), }");
  const size_t preamble = 10;
  while ((preamble + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  for (const model::DepthState& st : s.states) {
    out.append(reinterpret_cast<const char*>(st.values.data()),
               st.values.size() * sizeof(double));
  }
  return core::WriteFileAtomically(path, out);
}

}  // namespace satdar::runtime
