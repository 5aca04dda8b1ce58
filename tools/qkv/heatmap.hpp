// Attention-weight heatmaps rendered to PNG, for `qkv heatmap`.
//
// Depends on the standard library and libpng only. The picture, top to bottom:
//   - the title (optional), centred;
//   - a grid of panels, one per head, about square (ceil(sqrt(n)) columns), each with a panel title
//     ("head i" when Panel::title is empty) and a 1-pixel frame around its cells;
//   - query tokens down the left of the first grid column, key tokens along the bottom of every panel
//     that has no panel under it, written vertically (rotated 90 degrees, reading bottom to top) so
//     long tokens fit; when labels would overlap only every k-th token is labelled; the axis
//     captions "query" and "key" next to them;
//   - a colour bar on the right with ticks at round values.
// Colours: viridis (perceptually uniform) over one scale shared by all panels: [0, max] when no value
// is negative, [min, max] otherwise (a degenerate range widens to [lo, lo + 1]). Non-finite values
// (NaN, +-inf) are drawn in kNonFinite grey, and a "NaN/inf" swatch is added under the colour bar.
// Text uses the embedded 5x8 ASCII font of font.hpp at an integer scale; labels are reduced to
// printable ASCII (display_label) and cut to kMaxLabelChars with "..".
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::heatmap {

/// One head: row-major [rows, cols] weights, query rows x key columns.
struct Panel {
  std::string title;  // empty: "head <index>"
  std::int64_t rows = 0, cols = 0;
  std::vector<float> values;
};

struct Options {
  std::string title;                                // empty: no title line
  std::vector<std::string> row_labels, col_labels;  // may be empty: then indices are shown
  int cell_px = 0;                                  // 0 = choose automatically
};

/// RGB, 8 bits per channel, row-major, no padding: rgb.size() == 3 * width * height.
struct Image {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;
};

struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

inline constexpr Rgb kNonFinite{160, 160, 160};  // colour of NaN and infinite cells
inline constexpr Rgb kBackground{255, 255, 255};
inline constexpr std::size_t kMaxLabelChars = 12;  // longer labels are cut to 10 characters + ".."

/// Viridis at t in [0, 1] (clamped; NaN gives kNonFinite): viridis(0) is the bottom colour
/// (68, 1, 84), viridis(1) the top colour (253, 231, 37).
Rgb viridis(double t);

/// A token as drawn: printable ASCII kept; \n \r \t shown as the two characters "\n" "\r" "\t"; other
/// control bytes and each UTF-8 encoded non-ASCII character become '?'; then cut to kMaxLabelChars
/// (first kMaxLabelChars - 2 characters followed by "..").
std::string display_label(std::string_view token);

/// A rectangle of pixels [x, x + w) x [y, y + h).
struct Box {
  int x = 0, y = 0, w = 0, h = 0;
  bool empty() const { return w <= 0 || h <= 0; }
  bool intersects(const Box& o) const {
    return !empty() && !o.empty() && x < o.x + o.w && o.x < x + w && y < o.y + o.h && o.y < y + h;
  }
  bool contains(int px, int py) const { return px >= x && px < x + w && py >= y && py < y + h; }
};

/// A piece of text and the box its glyphs occupy (vertical text: rotated 90 degrees counter-clockwise).
struct Text {
  std::string text;
  Box box;
  int scale = 1;
  bool vertical = false;
};

/// A token label on a panel's axis: which panel, which row (query) or column (key).
struct AxisLabel {
  int panel = 0;
  std::int64_t index = 0;
  Text text;
};

struct ColorbarTick {
  double value = 0;
  int y = 0;  // pixel row of the tick on the bar
  Text label;
};

/// Where everything goes; render() draws exactly this. Exposed for tests and callers that annotate.
struct Layout {
  int width = 0, height = 0;
  int grid_rows = 0, grid_cols = 0;
  int cell_px = 0;
  int label_scale = 1;                         // font scale of token labels
  int row_label_step = 1, col_label_step = 1;  // every k-th token is labelled
  double scale_min = 0, scale_max = 1;         // the colour scale
  bool has_non_finite = false;
  Text title;                      // text empty: no title
  std::vector<Box> panels;         // the cells of panel i, frame excluded
  std::vector<Text> panel_titles;  // one per panel
  std::vector<AxisLabel> row_labels, col_labels;
  std::vector<Text> axis_captions;  // "query" (vertical) and "key"
  Box colorbar;
  std::vector<ColorbarTick> colorbar_ticks;
  Box non_finite_swatch;  // empty unless has_non_finite
  Text non_finite_label;
};

/// Computes the layout. Throws std::invalid_argument when there are no panels, when panel shapes
/// differ or do not match their values, when label counts differ from rows/cols, or when the image
/// would be unreasonably large (over 32768 pixels a side or 2^26 pixels).
Layout compute_layout(const std::vector<Panel>& panels, const Options& options);

/// Renders the panels (see the file comment); throws like compute_layout.
Image render(const std::vector<Panel>& panels, const Options& options);

/// img as an 8-bit RGB PNG file image (`path` names it in messages). Throws like write_png.
std::vector<std::uint8_t> encode_png(const std::filesystem::path& path, const Image& img);

/// Writes img as an 8-bit RGB PNG. Atomic: the data goes to a temporary file next to path, which is
/// then renamed over it, so path is either untouched or complete. Throws std::invalid_argument for a
/// malformed Image and std::runtime_error (message naming the path and the reason) when encoding or
/// any file operation fails; the temporary file is removed then.
void write_png(const std::filesystem::path& path, const Image& img);

}  // namespace qkv::heatmap
