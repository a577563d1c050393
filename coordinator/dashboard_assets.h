// coordinator/dashboard_assets.h: the dashboard's files (coordinator/dashboard/), compiled into
// the program by a genrule (BUILD.bazel), so the coordinator serves them with no build step of
// their own and nothing to install.
#ifndef SATDAR_COORDINATOR_DASHBOARD_ASSETS_H_
#define SATDAR_COORDINATOR_DASHBOARD_ASSETS_H_

#include <vector>

namespace satdar::coordinator {

struct DashboardAsset {
  const char* path;          // "/", "/dashboard.js", ...
  const char* content_type;
  const char* body;
};

const std::vector<DashboardAsset>& DashboardAssets();

}  // namespace satdar::coordinator

#endif  // SATDAR_COORDINATOR_DASHBOARD_ASSETS_H_
