// runtime/heatmap_png_test.cc: heatmap PNGs read back with libpng (size, cell colours, NaN,
// text, colour bar); the colour map; refusals of bad input and of an unwritable path.
#include "runtime/heatmap_png.h"

#include <png.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace satdar::runtime {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;

  Rgb At(int x, int y) const {
    const uint8_t* p = rgb.data() + (static_cast<size_t>(y) * width + x) * 3;
    return {p[0], p[1], p[2]};
  }
};

// The PNG at `path` as 8-bit RGB; fails the test when libpng cannot read it.
Image ReadPng(const std::string& path) {
  Image out;
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str())) {
    ADD_FAILURE() << "cannot read " << path << ": " << image.message;
    return out;
  }
  image.format = PNG_FORMAT_RGB;
  out.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, out.rgb.data(), 0, nullptr)) {
    ADD_FAILURE() << "cannot decode " << path << ": " << image.message;
    png_image_free(&image);
    return Image();
  }
  out.width = static_cast<int>(image.width);
  out.height = static_cast<int>(image.height);
  return out;
}

bool FileExists(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::fclose(f);
  return true;
}

// Panel "CKA s0-s1": 3 x 4 with vmin at (0, 0), vmax at (2, 3), NaN at (1, 2), a value below
// vmin at (2, 0) and one above vmax at (0, 3).
HeatmapPanel FirstPanel() {
  HeatmapPanel p;
  p.title = "CKA s0-s1";
  p.rows = 3;
  p.cols = 4;
  p.values = {0.0,  0.25, 0.5,  7.0,  //
              0.1,  0.2,  kNaN, 0.4,  //
              -5.0, 0.6,  0.9,  1.0};
  p.row_labels = {"d0", "d1", "d2"};
  p.col_labels = {"d0", "d1", "d2", "d3"};
  p.row_axis = "stream 0 depth";
  p.col_axis = "stream 1 depth";
  return p;
}

// A 2 x 2 panel with labels too wide for a cell (drawn upright) and every kind of character.
HeatmapPanel SecondPanel() {
  HeatmapPanel p;
  p.title = "Mixed (a+b=c) 50% _x_, 1/2: ok.";
  p.rows = 2;
  p.cols = 2;
  p.values = {1.0, 0.0, kNaN, 0.5};
  p.row_labels = {"layer 10", "layer 11"};
  p.col_labels = {"head-0", "head-1"};
  p.col_axis = "ABCDEFGHIJKLMNOPQRSTUVWXYZ ~";
  return p;
}

TEST(HeatmapColor, EndsClampingAndNaN) {
  const HeatmapStyle style{-1.0, 3.0, 24};
  EXPECT_EQ(HeatmapColor(-1.0, style), (Rgb{68, 1, 84}));
  EXPECT_EQ(HeatmapColor(3.0, style), (Rgb{253, 231, 37}));
  EXPECT_EQ(HeatmapColor(-100.0, style), HeatmapColor(-1.0, style));
  EXPECT_EQ(HeatmapColor(100.0, style), HeatmapColor(3.0, style));
  EXPECT_EQ(HeatmapColor(std::numeric_limits<double>::infinity(), style), HeatmapColor(3.0, style));
  EXPECT_EQ(HeatmapColor(kNaN, style), kHeatmapNanColor);
  // Brightness (the green channel here) rises along the map.
  int previous = -1;
  for (int i = 0; i <= 20; ++i) {
    const Rgb c = HeatmapColor(-1.0 + 4.0 * i / 20, style);
    EXPECT_GE(c[1], previous) << i;
    previous = c[1];
    EXPECT_NE(c, kHeatmapNanColor);
  }
}

TEST(WriteHeatmapPng, TwoPanelsReadBack) {
  const std::string path = testing::TempDir() + "/heatmap_two_panels.png";
  std::remove(path.c_str());
  const std::vector<HeatmapPanel> panels = {FirstPanel(), SecondPanel()};
  const HeatmapStyle style;  // [0, 1], 24-pixel cells
  absl::StatusOr<HeatmapLayout> layout = LayoutHeatmaps(panels, style);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->panels.size(), 2u);
  ASSERT_TRUE(WriteHeatmapPng(path, panels, style).ok());
  EXPECT_FALSE(FileExists(path + ".tmp"));

  const Image image = ReadPng(path);
  ASSERT_EQ(image.width, layout->width);
  ASSERT_EQ(image.height, layout->height);
  // The layout is consistent: grids and bar inside the image, side by side, bar at the right.
  const HeatmapLayout::Panel& a = layout->panels[0];
  const HeatmapLayout::Panel& b = layout->panels[1];
  EXPECT_GT(a.grid_x, 0);
  EXPECT_GT(b.grid_x, a.grid_x + 4 * style.cell);
  EXPECT_GT(layout->bar_x, b.grid_x + 2 * style.cell);
  EXPECT_LE(layout->bar_x + layout->bar_width, layout->width);
  EXPECT_LE(a.grid_y + 3 * style.cell, layout->height);
  EXPECT_LE(layout->bar_y + layout->bar_height, layout->height);

  const Rgb low = HeatmapColor(style.vmin, style), high = HeatmapColor(style.vmax, style);
  EXPECT_EQ(low, (Rgb{68, 1, 84}));
  EXPECT_EQ(high, (Rgb{253, 231, 37}));
  auto centre = [&](const HeatmapLayout::Panel& p, int r, int c) {
    return image.At(p.grid_x + c * style.cell + style.cell / 2,
                    p.grid_y + r * style.cell + style.cell / 2);
  };
  EXPECT_EQ(centre(a, 0, 0), low);   // vmin
  EXPECT_EQ(centre(a, 2, 3), high);  // vmax
  EXPECT_EQ(centre(a, 1, 2), kHeatmapNanColor);
  EXPECT_EQ(centre(a, 2, 0), low);   // below vmin
  EXPECT_EQ(centre(a, 0, 3), high);  // above vmax
  EXPECT_EQ(centre(a, 0, 2), HeatmapColor(0.5, style));
  EXPECT_EQ(centre(b, 0, 0), high);
  EXPECT_EQ(centre(b, 0, 1), low);
  EXPECT_EQ(centre(b, 1, 0), kHeatmapNanColor);
  // Whole cells have their colour: the corners of cell (0, 0) too.
  EXPECT_EQ(image.At(a.grid_x, a.grid_y), low);
  EXPECT_EQ(image.At(a.grid_x + style.cell - 1, a.grid_y + style.cell - 1), low);

  // The colour bar: vmax at the top, vmin at the bottom.
  const int bar_centre_x = layout->bar_x + layout->bar_width / 2;
  EXPECT_EQ(image.At(bar_centre_x, layout->bar_y), high);
  EXPECT_EQ(image.At(bar_centre_x, layout->bar_y + layout->bar_height - 1), low);

  // Titles are drawn in black inside their boxes; the image's corner stays white.
  for (const HeatmapLayout::Panel& p : layout->panels) {
    ASSERT_GT(p.title_width, 0);
    ASSERT_GT(p.title_height, 0);
    int black = 0;
    for (int y = p.title_y; y < p.title_y + p.title_height; ++y) {
      for (int x = p.title_x; x < p.title_x + p.title_width; ++x) {
        black += image.At(x, y) == Rgb{0, 0, 0};
      }
    }
    EXPECT_GT(black, 20);
  }
  EXPECT_EQ(image.At(0, 0), (Rgb{255, 255, 255}));
  // Text left of the first grid (row labels, row axis) and below it (column labels).
  int left_ink = 0, below_ink = 0;
  for (int y = a.grid_y; y < a.grid_y + 3 * style.cell; ++y) {
    for (int x = 0; x < a.grid_x - 2; ++x) left_ink += image.At(x, y) == Rgb{0, 0, 0};
  }
  for (int y = a.grid_y + 3 * style.cell + 2; y < image.height; ++y) {
    for (int x = a.grid_x; x < a.grid_x + 4 * style.cell; ++x) {
      below_ink += image.At(x, y) == Rgb{0, 0, 0};
    }
  }
  EXPECT_GT(left_ink, 20);
  EXPECT_GT(below_ink, 20);

  // Writing again replaces the file.
  HeatmapPanel one = FirstPanel();
  one.title.clear();
  ASSERT_TRUE(WriteHeatmapPng(path, {one}, style).ok());
  const Image second = ReadPng(path);
  EXPECT_LT(second.width, image.width);
}

TEST(WriteHeatmapPng, SmallCellsAndNoLabels) {
  const std::string path = testing::TempDir() + "/heatmap_small.png";
  HeatmapPanel p;
  p.rows = 40;
  p.cols = 30;
  p.values.resize(p.rows * p.cols);
  for (size_t i = 0; i < p.values.size(); ++i) p.values[i] = std::sin(0.1 * i);
  for (int r = 0; r < p.rows; ++r) p.row_labels.push_back("r" + std::to_string(r));
  const HeatmapStyle style{-1.0, 1.0, 3};
  ASSERT_TRUE(WriteHeatmapPng(path, {p}, style).ok());
  absl::StatusOr<HeatmapLayout> layout = LayoutHeatmaps({p}, style);
  ASSERT_TRUE(layout.ok());
  const Image image = ReadPng(path);
  EXPECT_EQ(image.width, layout->width);
  EXPECT_EQ(image.height, layout->height);
  EXPECT_EQ(layout->panels[0].title_height, 0);
}

TEST(WriteHeatmapPng, RefusesBadInput) {
  const std::string path = testing::TempDir() + "/heatmap_bad.png";
  std::remove(path.c_str());
  const HeatmapStyle style;
  auto expect_invalid = [&](const std::vector<HeatmapPanel>& panels, const HeatmapStyle& s,
                            const std::string& mentions) {
    const absl::Status status = WriteHeatmapPng(path, panels, s);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(std::string(status.message()).find(mentions), std::string::npos) << status;
    EXPECT_EQ(LayoutHeatmaps(panels, s).status().code(), absl::StatusCode::kInvalidArgument);
  };
  expect_invalid({}, style, "no panels");

  HeatmapPanel empty = FirstPanel();
  empty.title = "empty one";
  empty.rows = 0;
  empty.values.clear();
  expect_invalid({FirstPanel(), empty}, style, "empty one");

  HeatmapPanel short_values = FirstPanel();
  short_values.title = "short values";
  short_values.values.pop_back();
  expect_invalid({short_values}, style, "short values");

  HeatmapPanel labels = FirstPanel();
  labels.title = "label count";
  labels.col_labels.pop_back();
  expect_invalid({labels}, style, "label count");

  expect_invalid({FirstPanel()}, HeatmapStyle{1.0, 1.0, 24}, "vmin");
  expect_invalid({FirstPanel()}, HeatmapStyle{0.0, kNaN, 24}, "vmax");
  expect_invalid({FirstPanel()}, HeatmapStyle{0.0, 1.0, 0}, "cell");

  HeatmapPanel tall;
  tall.title = "tall";
  tall.rows = 300;
  tall.cols = 1;
  tall.values.assign(300, 0.5);
  expect_invalid({tall}, HeatmapStyle{0.0, 1.0, 256}, "pixels");

  EXPECT_FALSE(FileExists(path));
  EXPECT_FALSE(FileExists(path + ".tmp"));
}

TEST(WriteHeatmapPng, UnwritablePathNamesIt) {
  const std::string path = "/nonexistent/dir/x.png";
  const absl::Status status = WriteHeatmapPng(path, {FirstPanel()}, HeatmapStyle());
  EXPECT_FALSE(status.ok());
  EXPECT_NE(std::string(status.message()).find(path), std::string::npos) << status;
}

}  // namespace
}  // namespace satdar::runtime
