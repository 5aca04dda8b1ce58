// Attention-weight heatmaps: layout, rasterisation and PNG output. See heatmap.hpp.
#include "heatmap.hpp"

#include <png.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>

#include <qkv/runtime/io/array.hpp>
#include <qkv/runtime/io/files.hpp>

#include "font.hpp"
#include "raster.hpp"

namespace qkv::heatmap {
namespace {

// Viridis (matplotlib's, CC0), 33 samples at t = i / 32; linear interpolation between them stays
// within 2/255 of the 256-entry table.
constexpr std::array<Rgb, 33> kViridis = {{
    {68, 1, 84},    {71, 13, 96},   {72, 24, 106},  {72, 35, 116},  {71, 45, 123},  {69, 54, 129},  {66, 64, 134},
    {63, 73, 137},  {59, 82, 139},  {55, 90, 141},  {51, 99, 141},  {47, 106, 142}, {44, 114, 142}, {41, 122, 142},
    {38, 129, 142}, {35, 137, 142}, {33, 144, 140}, {31, 152, 139}, {31, 159, 136}, {33, 166, 133}, {40, 174, 128},
    {49, 181, 123}, {62, 188, 116}, {76, 194, 108}, {93, 201, 99},  {110, 206, 88}, {130, 211, 76}, {150, 216, 63},
    {171, 220, 50}, {192, 223, 36}, {213, 226, 26}, {234, 229, 26}, {253, 231, 37},
}};

constexpr Rgb kInk{25, 25, 25};         // text
constexpr Rgb kCaptionInk{90, 90, 90};  // "query", "key"
constexpr Rgb kFrame{70, 70, 70};       // panel and colour-bar frames, tick marks

// Geometry, in pixels.
constexpr int kMargin = 16;
constexpr int kTick = 4;          // tick mark length
constexpr int kTickGap = 3;       // between a tick mark and its label
constexpr int kPanelGapX = 24;    // between panels side by side
constexpr int kPanelGapY = 18;    // under a panel without key labels
constexpr int kCaptionScale = 2;  // "query" / "key"
constexpr int kPanelTitleScale = 2;
constexpr int kTickLabelScale = 2;  // colour bar
constexpr int kColorbarGap = 32;    // grid to colour bar
constexpr int kColorbarWidth = 20;
constexpr int kColorbarMinHeight = 120;
constexpr int kMaxSide = 32768;
constexpr std::int64_t kMaxPixels = std::int64_t{1} << 26;
constexpr std::int64_t kMaxTokens = std::int64_t{1} << 20;
constexpr std::size_t kMaxTitleChars = 160;

// Cut s to at most n characters, ending in ".." when cut.
std::string truncate(std::string s, std::size_t n) {
  if (s.size() <= n) return s;
  if (n <= 2) return s.substr(0, n);
  return s.substr(0, n - 2) + "..";
}

// display_label without the length limit.
std::string sanitize(std::string_view token) {
  std::string out;
  for (std::size_t i = 0; i < token.size(); ++i) {
    const auto c = static_cast<unsigned char>(token[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c >= 32 && c <= 126) {
      out += static_cast<char>(c);
    } else if (c >= 0xC0) {  // UTF-8 lead byte: one '?' for the whole character
      out += '?';
      while (i + 1 < token.size() && (static_cast<unsigned char>(token[i + 1]) & 0xC0) == 0x80) ++i;
    } else {
      out += '?';
    }
  }
  return out;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("heatmap: " + message);
}

// The auto cell size: panels of about `target` pixels, cells between 1 and 48 pixels.
int auto_cell_px(std::int64_t rows, std::int64_t cols, int grid_cols) {
  const int target = grid_cols <= 1 ? 512 : grid_cols == 2 ? 320 : grid_cols == 3 ? 240 : 200;
  const std::int64_t n = std::max(rows, cols);
  return static_cast<int>(std::clamp<std::int64_t>(target / n, 1, 48));
}

}  // namespace

Rgb viridis(double t) {
  if (std::isnan(t)) return kNonFinite;
  t = std::clamp(t, 0.0, 1.0);
  const double x = t * (kViridis.size() - 1);
  const std::size_t i = std::min(static_cast<std::size_t>(x), kViridis.size() - 2);
  const double f = x - static_cast<double>(i);
  const Rgb a = kViridis[i], b = kViridis[i + 1];
  auto mix = [f](std::uint8_t p, std::uint8_t q) {
    return static_cast<std::uint8_t>(std::lround(p + (static_cast<double>(q) - p) * f));
  };
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

std::string display_label(std::string_view token) { return truncate(sanitize(token), kMaxLabelChars); }

Layout compute_layout(const std::vector<Panel>& panels, const Options& options) {
  require(!panels.empty(), "no panels to draw");
  const std::int64_t rows = panels[0].rows, cols = panels[0].cols;
  for (std::size_t p = 0; p < panels.size(); ++p) {
    const Panel& panel = panels[p];
    const std::string which = "panel " + std::to_string(p);
    require(panel.rows > 0 && panel.cols > 0 && panel.rows <= kMaxTokens && panel.cols <= kMaxTokens,
            which + " has shape [" + std::to_string(panel.rows) + ", " + std::to_string(panel.cols) +
                "]; rows and cols must be in 1.." + std::to_string(kMaxTokens));
    require(panel.rows == rows && panel.cols == cols, which + " has shape [" + std::to_string(panel.rows) + ", " +
                                                          std::to_string(panel.cols) + "] but panel 0 has [" +
                                                          std::to_string(rows) + ", " + std::to_string(cols) + "]");
    require(static_cast<std::int64_t>(panel.values.size()) == rows * cols,
            which + " has " + std::to_string(panel.values.size()) + " values for shape [" + std::to_string(rows) +
                ", " + std::to_string(cols) + "]");
  }
  require(options.row_labels.empty() || static_cast<std::int64_t>(options.row_labels.size()) == rows,
          std::to_string(options.row_labels.size()) + " row labels for " + std::to_string(rows) + " rows");
  require(options.col_labels.empty() || static_cast<std::int64_t>(options.col_labels.size()) == cols,
          std::to_string(options.col_labels.size()) + " column labels for " + std::to_string(cols) + " columns");
  require(options.cell_px >= 0 && options.cell_px <= 512,
          "cell_px " + std::to_string(options.cell_px) + " is outside 0..512");

  Layout L;
  const int n = static_cast<int>(panels.size());
  L.grid_cols = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n)) - 1e-9));
  L.grid_rows = (n + L.grid_cols - 1) / L.grid_cols;
  L.cell_px = options.cell_px > 0 ? options.cell_px : auto_cell_px(rows, cols, L.grid_cols);
  const std::int64_t W64 = cols * L.cell_px, H64 = rows * L.cell_px;
  require(W64 * L.grid_cols <= kMaxSide && H64 * L.grid_rows <= kMaxSide,
          "panels of " + std::to_string(W64) + "x" + std::to_string(H64) + " pixels in a " +
              std::to_string(L.grid_cols) + "x" + std::to_string(L.grid_rows) + " grid do not fit in " +
              std::to_string(kMaxSide) + " pixels; use a smaller cell size or fewer tokens");
  const int W = static_cast<int>(W64), H = static_cast<int>(H64), cell = L.cell_px;

  // Colour scale over the finite values of all panels.
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const Panel& panel : panels) {
    for (float v : panel.values) {
      if (!std::isfinite(v)) {
        L.has_non_finite = true;
        continue;
      }
      lo = std::min(lo, static_cast<double>(v));
      hi = std::max(hi, static_cast<double>(v));
    }
  }
  if (!(lo <= hi)) lo = hi = 0;  // nothing finite
  if (lo > 0) lo = 0;
  if (!(hi > lo)) hi = lo + 1;
  L.scale_min = lo;
  L.scale_max = hi;

  // Token labels: scale 2 when cells or panels are big enough, every k-th token when they would overlap.
  L.label_scale = (cell >= 18 || std::max(W, H) >= 256) ? 2 : 1;
  const int ls = L.label_scale, th = text_height(ls);
  L.row_label_step = (th + 2 + cell - 1) / cell;
  L.col_label_step = L.row_label_step;
  auto label_text = [](const std::vector<std::string>& labels, std::int64_t i) {
    return labels.empty() ? std::to_string(i) : display_label(labels[static_cast<std::size_t>(i)]);
  };
  int row_label_w = 0, col_label_h = 0;
  for (std::int64_t i = 0; i < rows; i += L.row_label_step)
    row_label_w = std::max(row_label_w, text_width(label_text(options.row_labels, i), ls));
  for (std::int64_t j = 0; j < cols; j += L.col_label_step)
    col_label_h = std::max(col_label_h, text_width(label_text(options.col_labels, j), ls));

  // Axis captions only where the panel is long enough to hold them.
  const std::string query_caption = "query", key_caption = "key";
  const bool show_query = H >= text_width(query_caption, kCaptionScale) + 8;
  const bool show_key = W >= text_width(key_caption, kCaptionScale) + 8;
  const int caption_h = text_height(kCaptionScale);

  // Panel titles, cut to the room a panel has.
  const int title_room = W + kPanelGapX - 4;
  std::vector<std::string> titles(panels.size());
  int pt_scale = kPanelTitleScale;
  for (int p = 0; p < n; ++p) {
    titles[p] = sanitize(panels[p].title.empty() ? "head " + std::to_string(p) : panels[p].title);
    if (text_width(titles[p], kPanelTitleScale) > title_room) pt_scale = 1;
  }
  for (int p = 0; p < n; ++p) {
    const std::size_t fit =
        static_cast<std::size_t>(std::max(0, (title_room + pt_scale) / (font::kAdvance * pt_scale)));
    titles[p] = truncate(titles[p], fit);
  }
  const int pt_h = text_height(pt_scale);
  const int pt_gap = std::max(6, th / 2 + 4);  // room for the first row label reaching above the cells

  // Horizontal positions.
  const int grid_x = kMargin + (show_query ? caption_h + 8 : 0) + row_label_w + kTickGap + kTick + 1;
  auto panel_x = [&](int gc) { return grid_x + gc * (W + kPanelGapX); };
  const int grid_right = panel_x(L.grid_cols - 1) + W;

  // Vertical positions.
  const std::string title = truncate(sanitize(options.title), kMaxTitleChars);
  int y = kMargin;
  int title_scale = 3;
  if (!title.empty()) {
    if (text_width(title, 3) > grid_right - kMargin) title_scale = 2;
    y += text_height(title_scale) + 18;
  }
  auto has_panel = [&](int gr, int gc) { return gc < L.grid_cols && gr * L.grid_cols + gc < n; };
  auto needs_key_labels = [&](int p) { return !has_panel(p / L.grid_cols + 1, p % L.grid_cols); };
  std::vector<int> heat_y(L.grid_rows);
  int content_bottom = y;
  for (int gr = 0; gr < L.grid_rows; ++gr) {
    y += pt_h + pt_gap;
    heat_y[gr] = y;
    y += H + 1;  // + frame
    bool labelled = false;
    for (int gc = 0; gc < L.grid_cols; ++gc)
      labelled = labelled || (has_panel(gr, gc) && needs_key_labels(gr * L.grid_cols + gc));
    if (labelled) {
      y += kTick + kTickGap + col_label_h;
      if (show_key) y += 6 + caption_h;
    }
    content_bottom = y;
    y += kPanelGapY;
  }

  // Panels, their titles, token labels and captions.
  for (int p = 0; p < n; ++p) {
    const int gr = p / L.grid_cols, gc = p % L.grid_cols;
    const Box box{panel_x(gc), heat_y[gr], W, H};
    L.panels.push_back(box);
    const int tw = text_width(titles[p], pt_scale);
    L.panel_titles.push_back(make_text(titles[p], box.x + (W - tw) / 2, box.y - pt_gap - pt_h, pt_scale, false));
    if (gc == 0) {
      const int body = 7 * ls;  // capitals and digits: rows 0..6 of the glyph
      for (std::int64_t i = 0; i < rows; i += L.row_label_step) {
        std::string s = label_text(options.row_labels, i);
        const int centre = box.y + static_cast<int>(i) * cell + cell / 2;
        const int right = box.x - 1 - kTick - kTickGap;
        L.row_labels.push_back({p, i, make_text(s, right - text_width(s, ls), centre - body / 2, ls, false)});
      }
      if (show_query) {
        const int len = text_width(query_caption, kCaptionScale);
        L.axis_captions.push_back(make_text(query_caption, kMargin, box.y + (H - len) / 2, kCaptionScale, true));
      }
    }
    if (needs_key_labels(p)) {
      const int top = box.y + H + 1 + kTick + kTickGap;
      for (std::int64_t j = 0; j < cols; j += L.col_label_step) {
        std::string s = label_text(options.col_labels, j);
        const int centre = box.x + static_cast<int>(j) * cell + cell / 2;
        L.col_labels.push_back({p, j, make_text(s, centre - th / 2, top, ls, true)});
      }
      if (show_key) {
        const int kw = text_width(key_caption, kCaptionScale);
        L.axis_captions.push_back(
            make_text(key_caption, box.x + (W - kw) / 2, top + col_label_h + 6, kCaptionScale, false));
      }
    }
  }

  // Colour bar beside the grid, as tall as the panels (at least kColorbarMinHeight).
  const int cb_top = heat_y.front();
  const int cb_h = std::max(heat_y.back() + H - cb_top, kColorbarMinHeight);
  L.colorbar = {grid_right + kColorbarGap, cb_top, kColorbarWidth, cb_h};
  int decimals = 0;
  const std::vector<double> ticks = nice_ticks(lo, hi, &decimals);
  const double magnitude = std::max(std::fabs(lo), std::fabs(hi));
  int right = grid_right;
  for (double v : ticks) {
    ColorbarTick t;
    t.value = v;
    t.y = cb_top + static_cast<int>(std::lround((1.0 - (v - lo) / (hi - lo)) * (cb_h - 1)));
    std::string s = format_tick(v, decimals, magnitude);
    const int x = L.colorbar.x + L.colorbar.w + 1 + kTick + kTickGap;
    t.label = make_text(std::move(s), x, t.y - (7 * kTickLabelScale) / 2, kTickLabelScale, false);
    right = std::max(right, t.label.box.x + t.label.box.w);
    L.colorbar_ticks.push_back(std::move(t));
  }
  const int cb_bottom = cb_top + cb_h + text_height(kTickLabelScale) / 2;  // the lowest tick label may hang below
  int bottom = std::max(content_bottom, cb_bottom);
  if (L.has_non_finite) {
    const int sy = cb_bottom + 12;
    L.non_finite_swatch = {L.colorbar.x, sy, kColorbarWidth, 14};
    L.non_finite_label = make_text("NaN/inf", L.colorbar.x + kColorbarWidth + 6, sy - 1, kTickLabelScale, false);
    right = std::max(right, L.non_finite_label.box.x + L.non_finite_label.box.w);
    bottom = std::max(bottom, L.non_finite_label.box.y + L.non_finite_label.box.h);
  }
  right = std::max(right, L.colorbar.x + L.colorbar.w + 1);

  // Title centred over the whole picture; widen the picture for a long one.
  const int title_w = text_width(title, title_scale);
  L.width = std::max(right + kMargin, title_w + 2 * kMargin);
  L.height = bottom + kMargin;
  if (!title.empty()) L.title = make_text(title, (L.width - title_w) / 2, kMargin, title_scale, false);
  require(static_cast<std::int64_t>(L.width) * L.height <= kMaxPixels && L.width <= kMaxSide && L.height <= kMaxSide,
          "the image would be " + std::to_string(L.width) + "x" + std::to_string(L.height) +
              " pixels; use a smaller cell size or fewer tokens");
  return L;
}

Image render(const std::vector<Panel>& panels, const Options& options) {
  const Layout L = compute_layout(panels, options);
  Image img;
  img.width = L.width;
  img.height = L.height;
  img.rgb.assign(static_cast<std::size_t>(L.width) * static_cast<std::size_t>(L.height) * 3, 255);
  Canvas c{L.width, L.height, img.rgb};

  const double lo = L.scale_min, span = L.scale_max - L.scale_min;
  auto colour = [&](float v) { return std::isfinite(v) ? viridis((static_cast<double>(v) - lo) / span) : kNonFinite; };

  if (!L.title.text.empty()) c.text(L.title, kInk);
  const int cell = L.cell_px;
  for (std::size_t p = 0; p < panels.size(); ++p) {
    const Box& b = L.panels[p];
    const Panel& panel = panels[p];
    for (std::int64_t i = 0; i < panel.rows; ++i)
      for (std::int64_t j = 0; j < panel.cols; ++j)
        c.fill({b.x + static_cast<int>(j) * cell, b.y + static_cast<int>(i) * cell, cell, cell},
               colour(panel.values[static_cast<std::size_t>(i * panel.cols + j)]));
    c.frame(b, kFrame);
    c.text(L.panel_titles[p], kInk);
  }
  for (const AxisLabel& a : L.row_labels) {
    const Box& b = L.panels[static_cast<std::size_t>(a.panel)];
    const int yc = b.y + static_cast<int>(a.index) * cell + cell / 2;
    c.fill({b.x - 1 - kTick, yc, kTick, 1}, kFrame);
    c.text(a.text, kInk);
  }
  for (const AxisLabel& a : L.col_labels) {
    const Box& b = L.panels[static_cast<std::size_t>(a.panel)];
    const int xc = b.x + static_cast<int>(a.index) * cell + cell / 2;
    c.fill({xc, b.y + b.h + 1, 1, kTick}, kFrame);
    c.text(a.text, kInk);
  }
  for (const Text& t : L.axis_captions) c.text(t, kCaptionInk);

  const Box& cb = L.colorbar;
  for (int yy = 0; yy < cb.h; ++yy)
    c.fill({cb.x, cb.y + yy, cb.w, 1}, viridis(1.0 - static_cast<double>(yy) / std::max(1, cb.h - 1)));
  c.frame(cb, kFrame);
  for (const ColorbarTick& t : L.colorbar_ticks) {
    c.fill({cb.x + cb.w + 1, t.y, kTick, 1}, kFrame);
    c.text(t.label, kInk);
  }
  if (L.has_non_finite) {
    c.fill(L.non_finite_swatch, kNonFinite);
    c.frame(L.non_finite_swatch, kFrame);
    c.text(L.non_finite_label, kInk);
  }
  return img;
}

// ---- PNG output ------------------------------------------------------------------------------

namespace {

[[noreturn]] void write_failure(const std::filesystem::path& path, const std::string& why) {
  throw std::runtime_error("cannot write PNG '" + path.string() + "': " + why);
}

}  // namespace

std::vector<std::uint8_t> encode_png(const std::filesystem::path& path, const Image& img) {
  if (img.width <= 0 || img.height <= 0 || img.width > kMaxSide || img.height > kMaxSide ||
      img.rgb.size() != static_cast<std::size_t>(img.width) * static_cast<std::size_t>(img.height) * 3)
    throw std::invalid_argument("write_png: image of " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                                " pixels has " + std::to_string(img.rgb.size()) + " bytes of RGB");
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(img.width);
  image.height = static_cast<png_uint_32>(img.height);
  image.format = PNG_FORMAT_RGB;
  const png_int_32 stride = img.width * 3;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, img.rgb.data(), stride, nullptr)) {
    const std::string why = image.message;
    png_image_free(&image);
    write_failure(path, "libpng: " + why);
  }
  std::vector<std::uint8_t> out(size);
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, img.rgb.data(), stride, nullptr)) {
    const std::string why = image.message;
    png_image_free(&image);
    write_failure(path, "libpng: " + why);
  }
  out.resize(size);
  return out;
}

void write_png(const std::filesystem::path& path, const Image& img) {
  if (!path.has_filename()) write_failure(path, "the path has no file name");
  const std::vector<std::uint8_t> data = encode_png(path, img);
  try {
    write_file_atomic(path, std::as_bytes(std::span(data)));  // staged, fsync'ed, renamed into place
  } catch (const IoError& e) {
    write_failure(path, e.what());
  }
}

}  // namespace qkv::heatmap
