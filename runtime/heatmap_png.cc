// runtime/heatmap_png.cc: the heatmap renderer (see heatmap_png.h): layout, an RGB canvas with
// a 5x7 bitmap font, the colour map, and the PNG written through libpng's simplified API.
#include "runtime/heatmap_png.h"

#include <png.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace satdar::runtime {
namespace {

// The font: 7 rows of 5 pixels per glyph, rows separated by spaces, '#' = ink. A glyph is drawn
// in a 6 x 7 box (one column of spacing) at scale 1 or 2.
struct Glyph {
  char c;
  const char* rows;
};

constexpr Glyph kFont[] = {
    {' ', "..... ..... ..... ..... ..... ..... ....."},
    {'.', "..... ..... ..... ..... ..... .##.. .##.."},
    {',', "..... ..... ..... ..... .##.. ..#.. .#..."},
    {'-', "..... ..... ..... ##### ..... ..... ....."},
    {'+', "..... ..#.. ..#.. ##### ..#.. ..#.. ....."},
    {':', "..... .##.. .##.. ..... .##.. .##.. ....."},
    {'/', "..... ....# ...#. ..#.. .#... #.... ....."},
    {'(', "...#. ..#.. .#... .#... .#... ..#.. ...#."},
    {')', ".#... ..#.. ...#. ...#. ...#. ..#.. .#..."},
    {'=', "..... ..... ##### ..... ##### ..... ....."},
    {'_', "..... ..... ..... ..... ..... ..... #####"},
    {'%', "##... ##..# ...#. ..#.. .#... #..## ...##"},
    {'0', ".###. #...# #..## #.#.# ##..# #...# .###."},
    {'1', "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###."},
    {'2', ".###. #...# ....# ...#. ..#.. .#... #####"},
    {'3', "##### ...#. ..#.. ...#. ....# #...# .###."},
    {'4', "...#. ..##. .#.#. #..#. ##### ...#. ...#."},
    {'5', "##### #.... ####. ....# ....# #...# .###."},
    {'6', "..##. .#... #.... ####. #...# #...# .###."},
    {'7', "##### ....# ...#. ..#.. .#... .#... .#..."},
    {'8', ".###. #...# #...# .###. #...# #...# .###."},
    {'9', ".###. #...# #...# .#### ....# ...#. .##.."},
    {'A', ".###. #...# #...# ##### #...# #...# #...#"},
    {'B', "####. #...# #...# ####. #...# #...# ####."},
    {'C', ".###. #...# #.... #.... #.... #...# .###."},
    {'D', "####. #...# #...# #...# #...# #...# ####."},
    {'E', "##### #.... #.... ####. #.... #.... #####"},
    {'F', "##### #.... #.... ####. #.... #.... #...."},
    {'G', ".###. #...# #.... #.### #...# #...# .####"},
    {'H', "#...# #...# #...# ##### #...# #...# #...#"},
    {'I', ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###."},
    {'J', "..### ...#. ...#. ...#. ...#. #..#. .##.."},
    {'K', "#...# #..#. #.#.. ##... #.#.. #..#. #...#"},
    {'L', "#.... #.... #.... #.... #.... #.... #####"},
    {'M', "#...# ##.## #.#.# #.#.# #...# #...# #...#"},
    {'N', "#...# #...# ##..# #.#.# #..## #...# #...#"},
    {'O', ".###. #...# #...# #...# #...# #...# .###."},
    {'P', "####. #...# #...# ####. #.... #.... #...."},
    {'Q', ".###. #...# #...# #...# #.#.# #..#. .##.#"},
    {'R', "####. #...# #...# ####. #.#.. #..#. #...#"},
    {'S', ".#### #.... #.... .###. ....# ....# ####."},
    {'T', "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#.."},
    {'U', "#...# #...# #...# #...# #...# #...# .###."},
    {'V', "#...# #...# #...# #...# #...# .#.#. ..#.."},
    {'W', "#...# #...# #...# #.#.# #.#.# #.#.# .#.#."},
    {'X', "#...# #...# .#.#. ..#.. .#.#. #...# #...#"},
    {'Y', "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#.."},
    {'Z', "##### ....# ...#. ..#.. .#... #.... #####"},
    {'a', "..... ..... .###. ....# .#### #...# .####"},
    {'b', "#.... #.... #.##. ##..# #...# #...# ####."},
    {'c', "..... ..... .###. #.... #.... #...# .###."},
    {'d', "....# ....# .##.# #..## #...# #...# .####"},
    {'e', "..... ..... .###. #...# ##### #.... .###."},
    {'f', "..##. .#..# .#... ###.. .#... .#... .#..."},
    {'g', "..... ..... .#### #...# .#### ....# .###."},
    {'h', "#.... #.... #.##. ##..# #...# #...# #...#"},
    {'i', "..#.. ..... .##.. ..#.. ..#.. ..#.. .###."},
    {'j', "...#. ..... ..##. ...#. ...#. #..#. .##.."},
    {'k', "#.... #.... #..#. #.#.. ##... #.#.. #..#."},
    {'l', ".##.. ..#.. ..#.. ..#.. ..#.. ..#.. .###."},
    {'m', "..... ..... ##.#. #.#.# #.#.# #...# #...#"},
    {'n', "..... ..... #.##. ##..# #...# #...# #...#"},
    {'o', "..... ..... .###. #...# #...# #...# .###."},
    {'p', "..... ..... ####. #...# ####. #.... #...."},
    {'q', "..... ..... .#### #...# .#### ....# ....#"},
    {'r', "..... ..... #.##. ##..# #.... #.... #...."},
    {'s', "..... ..... .#### #.... .###. ....# ####."},
    {'t', ".#... .#... ###.. .#... .#... .#..# ..##."},
    {'u', "..... ..... #...# #...# #...# #..## .##.#"},
    {'v', "..... ..... #...# #...# #...# .#.#. ..#.."},
    {'w', "..... ..... #...# #...# #.#.# #.#.# .#.#."},
    {'x', "..... ..... #...# .#.#. ..#.. .#.#. #...#"},
    {'y', "..... ..... #...# #...# .#### ....# .###."},
    {'z', "..... ..... ##### ...#. ..#.. .#... #####"},
};
// Any other character.
constexpr const char* kUnknownGlyph = "..... ##### #...# #...# #...# ##### .....";

constexpr int kGlyphWidth = 5;
constexpr int kGlyphHeight = 7;
constexpr int kAdvance = 6;  // glyph plus one column of spacing

// Every glyph is 7 rows of 5 '#' or '.' separated by single spaces, and no character has two.
constexpr bool WellFormed(const char* rows) {
  for (int i = 0; i < kGlyphHeight * (kGlyphWidth + 1) - 1; ++i) {
    const bool separator = i % (kGlyphWidth + 1) == kGlyphWidth;
    if (separator ? rows[i] != ' ' : (rows[i] != '#' && rows[i] != '.')) return false;
  }
  return rows[kGlyphHeight * (kGlyphWidth + 1) - 1] == '\0';
}
constexpr bool FontWellFormed() {
  const int count = sizeof(kFont) / sizeof(kFont[0]);
  for (int i = 0; i < count; ++i) {
    if (!WellFormed(kFont[i].rows)) return false;
    for (int j = 0; j < i; ++j) {
      if (kFont[j].c == kFont[i].c) return false;
    }
  }
  return WellFormed(kUnknownGlyph);
}
static_assert(FontWellFormed(), "a malformed or repeated glyph in kFont");

constexpr int kMargin = 12;
constexpr int kGap = 4;         // between a grid and its labels, labels and axis names
constexpr int kPanelGap = 28;   // between panels, and before the colour bar
constexpr int kTitleScale = 2;  // labels and axis names are drawn at scale 1
constexpr int kBarWidth = 16;
constexpr int kMinBarHeight = 80;
constexpr int kMaxCell = 256;
constexpr int64_t kMaxSide = 1 << 16;
constexpr int64_t kMaxPixels = int64_t{1} << 26;

constexpr Rgb kWhite = {255, 255, 255};
constexpr Rgb kInk = {0, 0, 0};
constexpr Rgb kFrame = {64, 64, 64};

// Viridis-like control points, evenly spaced over [0, 1].
constexpr Rgb kColorMap[] = {{68, 1, 84},    {70, 50, 126},  {54, 92, 141},  {39, 127, 142},
                             {31, 161, 135}, {74, 193, 109}, {160, 218, 57}, {253, 231, 37}};
constexpr int kColorPoints = sizeof(kColorMap) / sizeof(kColorMap[0]);

const char* GlyphRows(char c) {
  for (const Glyph& g : kFont) {
    if (g.c == c) return g.rows;
  }
  return kUnknownGlyph;
}

int64_t TextWidth(const std::string& text, int scale) {
  if (text.empty()) return 0;
  return (static_cast<int64_t>(text.size()) * kAdvance - 1) * scale;
}

int64_t MaxTextWidth(const std::vector<std::string>& texts) {
  int64_t w = 0;
  for (const std::string& t : texts) w = std::max(w, TextWidth(t, 1));
  return w;
}

// The colour at fraction t in [0, 1] of the map.
Rgb ColorAt(double t) {
  t = std::clamp(t, 0.0, 1.0);
  const double pos = t * (kColorPoints - 1);
  const int i = std::min(kColorPoints - 2, static_cast<int>(pos));
  const double f = pos - i;
  Rgb out;
  for (int ch = 0; ch < 3; ++ch) {
    const double v = kColorMap[i][ch] + f * (kColorMap[i + 1][ch] - kColorMap[i][ch]);
    out[ch] = static_cast<uint8_t>(std::lround(v));
  }
  return out;
}

std::string FormatValue(double v) { return absl::StrFormat("%.4g", v); }

// An RGB image, 3 bytes per pixel, row-major; drawing outside it is clipped.
class Canvas {
 public:
  Canvas(int width, int height)
      : width_(width), height_(height), rgb_(static_cast<size_t>(width) * height * 3, 255) {}

  void Set(int64_t x, int64_t y, const Rgb& c) {
    if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
    uint8_t* p = rgb_.data() + (static_cast<size_t>(y) * width_ + x) * 3;
    p[0] = c[0];
    p[1] = c[1];
    p[2] = c[2];
  }

  void FillRect(int64_t x, int64_t y, int64_t w, int64_t h, const Rgb& c) {
    for (int64_t yy = std::max<int64_t>(y, 0); yy < std::min<int64_t>(y + h, height_); ++yy) {
      for (int64_t xx = std::max<int64_t>(x, 0); xx < std::min<int64_t>(x + w, width_); ++xx) {
        Set(xx, yy, c);
      }
    }
  }

  // A one-pixel outline just outside the rectangle (x, y, w, h).
  void Frame(int64_t x, int64_t y, int64_t w, int64_t h, const Rgb& c) {
    FillRect(x - 1, y - 1, w + 2, 1, c);
    FillRect(x - 1, y + h, w + 2, 1, c);
    FillRect(x - 1, y, 1, h, c);
    FillRect(x + w, y, 1, h, c);
  }

  // Text left to right, its top-left corner at (x, y).
  void Text(int64_t x, int64_t y, const std::string& text, int scale, const Rgb& c) {
    for (size_t k = 0; k < text.size(); ++k) {
      const char* rows = GlyphRows(text[k]);
      for (int gy = 0; gy < kGlyphHeight; ++gy) {
        for (int gx = 0; gx < kGlyphWidth; ++gx) {
          if (rows[gy * (kGlyphWidth + 1) + gx] != '#') continue;
          FillRect(x + (static_cast<int64_t>(k) * kAdvance + gx) * scale, y + gy * scale, scale,
                   scale, c);
        }
      }
    }
  }

  // Text turned a quarter turn anticlockwise (read bottom to top), scale 1: its first
  // character's bottom-left corner at (x, y_bottom - 1); it spans kGlyphHeight columns from x.
  void TextUp(int64_t x, int64_t y_bottom, const std::string& text, const Rgb& c) {
    for (size_t k = 0; k < text.size(); ++k) {
      const char* rows = GlyphRows(text[k]);
      for (int gy = 0; gy < kGlyphHeight; ++gy) {
        for (int gx = 0; gx < kGlyphWidth; ++gx) {
          if (rows[gy * (kGlyphWidth + 1) + gx] != '#') continue;
          Set(x + gy, y_bottom - 1 - (static_cast<int64_t>(k) * kAdvance + gx), c);
        }
      }
    }
  }

  const uint8_t* data() const { return rgb_.data(); }

 private:
  int width_, height_;
  std::vector<uint8_t> rgb_;
};

// A panel's measures (pixels), besides those HeatmapLayout reports.
struct PanelGeometry {
  int64_t x = 0;            // the panel's left edge
  int64_t width = 0;        // its width
  int64_t grid_width = 0;   // cols * cell
  int64_t grid_height = 0;  // rows * cell
  bool vertical_col_labels = false;
  int64_t col_labels_height = 0;  // with the gap above them; 0 without labels
};

std::string PanelName(size_t index, const HeatmapPanel& p) {
  return absl::StrCat("heatmap panel ", index, " (\"", p.title, "\")");
}

absl::Status CheckInput(const std::vector<HeatmapPanel>& panels, const HeatmapStyle& style) {
  if (panels.empty()) return absl::InvalidArgumentError("heatmap: no panels to draw");
  if (!std::isfinite(style.vmin) || !std::isfinite(style.vmax) || !(style.vmin < style.vmax)) {
    return absl::InvalidArgumentError(absl::StrCat("heatmap style: vmin (", style.vmin,
                                                   ") must be below vmax (", style.vmax,
                                                   "), both finite"));
  }
  if (style.cell < 1 || style.cell > kMaxCell) {
    return absl::InvalidArgumentError(
        absl::StrCat("heatmap style: cell must be 1 to ", kMaxCell, " pixels, got ", style.cell));
  }
  for (size_t i = 0; i < panels.size(); ++i) {
    const HeatmapPanel& p = panels[i];
    if (p.rows < 1 || p.cols < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(PanelName(i, p), ": no cells (rows ", p.rows, ", cols ", p.cols, ")"));
    }
    const int64_t cells = static_cast<int64_t>(p.rows) * p.cols;
    if (static_cast<int64_t>(p.values.size()) != cells) {
      return absl::InvalidArgumentError(
          absl::StrCat(PanelName(i, p), ": values has ", p.values.size(),
                       " elements, rows x cols = ", p.rows, " x ", p.cols, " = ", cells));
    }
    if (!p.row_labels.empty() && static_cast<int64_t>(p.row_labels.size()) != p.rows) {
      return absl::InvalidArgumentError(absl::StrCat(PanelName(i, p), ": ", p.row_labels.size(),
                                                     " row_labels for ", p.rows, " rows"));
    }
    if (!p.col_labels.empty() && static_cast<int64_t>(p.col_labels.size()) != p.cols) {
      return absl::InvalidArgumentError(absl::StrCat(PanelName(i, p), ": ", p.col_labels.size(),
                                                     " col_labels for ", p.cols, " cols"));
    }
  }
  return absl::OkStatus();
}

// The layout and each panel's geometry (the checks of CheckInput first).
absl::StatusOr<HeatmapLayout> ComputeLayout(const std::vector<HeatmapPanel>& panels,
                                            const HeatmapStyle& style,
                                            std::vector<PanelGeometry>* geometry) {
  if (absl::Status s = CheckInput(panels, style); !s.ok()) return s;
  const int64_t cell = style.cell;
  bool any_title = false;
  for (const HeatmapPanel& p : panels) any_title |= !p.title.empty();
  const int64_t title_height = kGlyphHeight * kTitleScale;
  const int64_t grid_y = kMargin + (any_title ? title_height + 2 * kGap : 0);

  HeatmapLayout layout;
  geometry->assign(panels.size(), PanelGeometry());
  int64_t x = kMargin, body_height = 0, max_grid_height = 0;
  for (size_t i = 0; i < panels.size(); ++i) {
    const HeatmapPanel& p = panels[i];
    PanelGeometry& g = (*geometry)[i];
    const int64_t row_axis_width = p.row_axis.empty() ? 0 : kGlyphHeight + kGap;
    const int64_t row_labels_width = p.row_labels.empty() ? 0 : MaxTextWidth(p.row_labels) + kGap;
    const int64_t left = row_axis_width + row_labels_width;
    g.grid_width = p.cols * cell;
    g.grid_height = p.rows * cell;
    const int64_t col_label_width = MaxTextWidth(p.col_labels);
    g.vertical_col_labels = col_label_width > cell - 2;
    if (!p.col_labels.empty()) {
      g.col_labels_height = kGap + (g.vertical_col_labels ? col_label_width : kGlyphHeight);
    }
    const int64_t col_axis_height = p.col_axis.empty() ? 0 : kGap + kGlyphHeight;
    const int64_t title_width = TextWidth(p.title, kTitleScale);
    g.x = x;
    g.width = std::max({left + g.grid_width, title_width, TextWidth(p.col_axis, 1)});
    body_height = std::max({body_height, g.grid_height + g.col_labels_height + col_axis_height,
                            TextWidth(p.row_axis, 1)});
    max_grid_height = std::max(max_grid_height, g.grid_height);

    HeatmapLayout::Panel box;
    const int64_t grid_x = x + left;
    box.grid_x = static_cast<int>(std::min(grid_x, kMaxSide));
    box.grid_y = static_cast<int>(grid_y);
    const int64_t centred = grid_x + g.grid_width / 2 - title_width / 2;
    box.title_x = static_cast<int>(
        std::min(std::clamp(centred, x, std::max(x, x + g.width - title_width)), kMaxSide));
    box.title_y = kMargin;
    box.title_width = static_cast<int>(std::min(title_width, kMaxSide));
    box.title_height = p.title.empty() ? 0 : static_cast<int>(title_height);
    layout.panels.push_back(box);
    x += g.width + kPanelGap;
    if (x > kMaxSide) break;  // refused below
  }
  const int64_t bar_height = std::max<int64_t>(max_grid_height, kMinBarHeight);
  const int64_t bar_labels_width =
      std::max({TextWidth(FormatValue(style.vmin), 1), TextWidth(FormatValue(style.vmax), 1),
                TextWidth(FormatValue(0.5 * (style.vmin + style.vmax)), 1)});
  const int64_t width = x + kBarWidth + kGap + bar_labels_width + kMargin;
  const int64_t height = grid_y + std::max(body_height, bar_height) + kMargin;
  if (width > kMaxSide || height > kMaxSide || width * height > kMaxPixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heatmap: the image would be ", width, " x ", height, " pixels, over the limit of ",
        kMaxPixels, " pixels (", kMaxSide, " a side); use fewer or smaller cells"));
  }
  layout.width = static_cast<int>(width);
  layout.height = static_cast<int>(height);
  layout.bar_x = static_cast<int>(x);
  layout.bar_y = static_cast<int>(grid_y);
  layout.bar_width = kBarWidth;
  layout.bar_height = static_cast<int>(bar_height);
  return layout;
}

void DrawPanel(const HeatmapPanel& p, const HeatmapLayout::Panel& box, const PanelGeometry& g,
               const HeatmapStyle& style, Canvas* canvas) {
  const int64_t cell = style.cell;
  const int64_t gx = box.grid_x, gy = box.grid_y;
  if (!p.title.empty()) canvas->Text(box.title_x, box.title_y, p.title, kTitleScale, kInk);
  for (int r = 0; r < p.rows; ++r) {
    for (int c = 0; c < p.cols; ++c) {
      const double v = p.values[static_cast<size_t>(r) * p.cols + c];
      canvas->FillRect(gx + c * cell, gy + r * cell, cell, cell, HeatmapColor(v, style));
    }
  }
  canvas->Frame(gx, gy, g.grid_width, g.grid_height, kFrame);

  // Row labels, right-aligned; with small cells only those that do not overlap the previous.
  int64_t free_y = gy - cell;
  for (int r = 0; r < static_cast<int>(p.row_labels.size()); ++r) {
    const int64_t y = gy + r * cell + (cell - kGlyphHeight) / 2;
    if (y < free_y) continue;
    canvas->Text(gx - kGap - TextWidth(p.row_labels[r], 1), y, p.row_labels[r], 1, kInk);
    free_y = y + kGlyphHeight + 1;
  }
  if (!p.row_axis.empty()) {
    const int64_t len = TextWidth(p.row_axis, 1);
    const int64_t top = std::max(gy, gy + (g.grid_height - len) / 2);
    canvas->TextUp(g.x, top + len, p.row_axis, kInk);
  }

  // Column labels: centred under their cells, or turned upright when wider than a cell.
  const int64_t labels_y = gy + g.grid_height + kGap;
  int64_t free_x = gx - cell;
  for (int c = 0; c < static_cast<int>(p.col_labels.size()); ++c) {
    const std::string& label = p.col_labels[c];
    const int64_t w = TextWidth(label, 1);
    if (g.vertical_col_labels) {
      const int64_t x = gx + c * cell + (cell - kGlyphHeight) / 2;
      if (x < free_x) continue;
      canvas->TextUp(x, labels_y + w, label, kInk);
      free_x = x + kGlyphHeight + 1;
    } else {
      canvas->Text(gx + c * cell + (cell - w) / 2, labels_y, label, 1, kInk);
    }
  }
  if (!p.col_axis.empty()) {
    const int64_t w = TextWidth(p.col_axis, 1);
    const int64_t x = std::clamp(gx + g.grid_width / 2 - w / 2, g.x, g.x + g.width - w);
    canvas->Text(x, gy + g.grid_height + g.col_labels_height + kGap, p.col_axis, 1, kInk);
  }
}

void DrawColorBar(const HeatmapLayout& layout, const HeatmapStyle& style, Canvas* canvas) {
  const int h = layout.bar_height;
  for (int y = 0; y < h; ++y) {
    const double t = h == 1 ? 1.0 : 1.0 - static_cast<double>(y) / (h - 1);
    canvas->FillRect(layout.bar_x, layout.bar_y + y, layout.bar_width, 1, ColorAt(t));
  }
  canvas->Frame(layout.bar_x, layout.bar_y, layout.bar_width, h, kFrame);
  const int64_t x = layout.bar_x + layout.bar_width + kGap;
  canvas->Text(x, layout.bar_y, FormatValue(style.vmax), 1, kInk);
  canvas->Text(x, layout.bar_y + (h - kGlyphHeight) / 2,
               FormatValue(0.5 * (style.vmin + style.vmax)), 1, kInk);
  canvas->Text(x, layout.bar_y + h - kGlyphHeight, FormatValue(style.vmin), 1, kInk);
}

// An error of writing `path` (through path + ".tmp"), its code from errno.
absl::Status WriteError(const std::string& path, const std::string& what, int err) {
  const std::string msg =
      absl::StrCat("cannot write heatmap PNG ", path, ": ", what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

Rgb HeatmapColor(double value, const HeatmapStyle& style) {
  if (std::isnan(value)) return kHeatmapNanColor;
  if (!(style.vmax > style.vmin)) return ColorAt(0.0);
  return ColorAt((value - style.vmin) / (style.vmax - style.vmin));
}

absl::StatusOr<HeatmapLayout> LayoutHeatmaps(const std::vector<HeatmapPanel>& panels,
                                             const HeatmapStyle& style) {
  std::vector<PanelGeometry> geometry;
  return ComputeLayout(panels, style, &geometry);
}

absl::Status WriteHeatmapPng(const std::string& path, const std::vector<HeatmapPanel>& panels,
                             const HeatmapStyle& style) {
  std::vector<PanelGeometry> geometry;
  absl::StatusOr<HeatmapLayout> layout = ComputeLayout(panels, style, &geometry);
  if (!layout.ok()) return layout.status();
  Canvas canvas(layout->width, layout->height);
  canvas.FillRect(0, 0, layout->width, layout->height, kWhite);
  for (size_t i = 0; i < panels.size(); ++i) {
    DrawPanel(panels[i], layout->panels[i], geometry[i], style, &canvas);
  }
  DrawColorBar(*layout, style, &canvas);

  const std::string tmp = path + ".tmp";
  FILE* file = std::fopen(tmp.c_str(), "wb");
  if (file == nullptr) {
    const int err = errno;
    return WriteError(path, absl::StrCat("cannot create ", tmp), err);
  }
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(layout->width);
  image.height = static_cast<png_uint_32>(layout->height);
  image.format = PNG_FORMAT_RGB;
  const int written = png_image_write_to_stdio(&image, file, /*convert_to_8_bit=*/0, canvas.data(),
                                               /*row_stride=*/0,
                                               /*colormap=*/nullptr);
  const std::string png_message = image.message;
  png_image_free(&image);
  if (!written) {
    std::fclose(file);
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write heatmap PNG ", path,
                                            ": libpng: ", png_message, " (writing ", tmp, ")"));
  }
  const bool write_failed = std::ferror(file) != 0;
  errno = 0;
  if (std::fclose(file) != 0 || write_failed) {
    const int err = errno != 0 ? errno : EIO;
    std::remove(tmp.c_str());
    return WriteError(path, absl::StrCat("cannot write ", tmp), err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return WriteError(path, absl::StrCat("cannot rename ", tmp, " to it"), err);
  }
  return absl::OkStatus();
}

}  // namespace satdar::runtime
