#include <dirent.h>

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/model.h"

namespace satdar {
namespace {

std::vector<std::string> JsonFiles(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.size() > 5 && name.substr(name.size() - 5) == ".json") out.push_back(dir + "/" + name);
  }
  closedir(d);
  return out;
}

TEST(Configs, EveryConfigBuildsItsModel) {
  std::vector<std::string> files;
  for (const char* dir : {"configs", "configs/cpu", "configs/bench"}) {
    for (const std::string& f : JsonFiles(dir)) files.push_back(f);
  }
  ASSERT_GT(files.size(), 50u);
  std::map<std::string, int64_t> params;
  core::ThreadPool pool(1);
  for (const std::string& f : files) {
    auto config = model::LoadModelConfig(f);
    ASSERT_TRUE(config.ok()) << config.status();
    auto m = model::CreateModel<float>(*config, &pool);
    ASSERT_TRUE(m.ok()) << f << ": " << m.status();
    params[f] = (*m)->params().size();
  }
  // The named settings have the sizes their names promise (MODELS.md section 7).
  EXPECT_NEAR(params["configs/transformer-130m.json"] / 1e6, 128.4, 0.1);
  EXPECT_NEAR(params["configs/transformer-760m.json"] / 1e6, 766.4, 0.2);
  EXPECT_NEAR(params["configs/transformer-1.3b.json"] / 1e6, 1298.8, 0.2);
  EXPECT_NEAR(params["configs/dar-moe-7b.json"] / 1e9, 6.92, 0.01);
  // SATFormer adds (L-1) * d * N gate weights.
  EXPECT_EQ(params["configs/satformer-130m.json"] - params["configs/transformer-130m.json"],
            10 * 768 * 12);
}

}  // namespace
}  // namespace satdar
