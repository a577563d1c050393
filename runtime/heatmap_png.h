// runtime/heatmap_png.h: heatmaps (e.g. CKA matrices between layers) rendered into a PNG with
// libpng: panels side by side, each with a title, row and column labels and axis names, and a
// shared colour bar. Text uses a built-in 5x7 bitmap font, so nothing but libpng is needed.
#ifndef SATDAR_RUNTIME_HEATMAP_PNG_H_
#define SATDAR_RUNTIME_HEATMAP_PNG_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace satdar::runtime {

// One heatmap: rows x cols values, row-major. NaN values are drawn grey. row_labels and
// col_labels are either empty (no labels) or hold one label per row / column. Text may use
// digits, letters, space and . , - + : / ( ) = _ %; other characters are drawn as a small box.
struct HeatmapPanel {
  std::string title;
  int rows = 0;
  int cols = 0;
  std::vector<double> values;
  std::vector<std::string> row_labels;
  std::vector<std::string> col_labels;
  std::string row_axis;  // drawn vertically, left of the row labels
  std::string col_axis;  // drawn below the column labels
};

struct HeatmapStyle {
  double vmin = 0;  // the colour map's low end; values below it clamp to it
  double vmax = 1;  // its high end; values above it clamp to it
  int cell = 24;    // the side of one cell, in pixels (1 to 256)
};

// The colour of a value: viridis-like (dark purple (68, 1, 84) at vmin through blue and green to
// yellow (253, 231, 37) at vmax), interpolated linearly between 8 control points; values outside
// [vmin, vmax] clamp; NaN is kHeatmapNanColor.
using Rgb = std::array<uint8_t, 3>;
inline constexpr Rgb kHeatmapNanColor = {160, 160, 160};
Rgb HeatmapColor(double value, const HeatmapStyle& style);

// Where WriteHeatmapPng puts things, in pixels from the image's top-left corner.
struct HeatmapLayout {
  struct Panel {
    int grid_x = 0, grid_y = 0;  // the top-left corner of cell (0, 0)
    int title_x = 0, title_y = 0, title_width = 0, title_height = 0;
  };
  int width = 0, height = 0;
  std::vector<Panel> panels;
  int bar_x = 0, bar_y = 0, bar_width = 0, bar_height = 0;  // the colour bar (vmax at the top)
};

// The layout of these panels, after the checks WriteHeatmapPng makes: InvalidArgument for no
// panels, a panel with no cells, values.size() != rows * cols or a label count that is neither
// 0 nor rows / cols (the message names the panel's title), a bad style (vmin >= vmax, either not
// finite, cell outside [1, 256]) or an image over 2^26 pixels.
absl::StatusOr<HeatmapLayout> LayoutHeatmaps(const std::vector<HeatmapPanel>& panels,
                                             const HeatmapStyle& style);

// Renders the panels into an 8-bit RGB PNG at `path`, written to path + ".tmp" and renamed, so
// `path` is either the old file or the complete new one. Errors: those of LayoutHeatmaps, and a
// failure to write or rename (the message names `path`).
absl::Status WriteHeatmapPng(const std::string& path, const std::vector<HeatmapPanel>& panels,
                             const HeatmapStyle& style);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_HEATMAP_PNG_H_
