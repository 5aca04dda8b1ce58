// Unit tests for the attention heatmap renderer (tools/qkv/heatmap.hpp): layout, colours, text and
// the PNG written to disk, decoded back with libpng.
#include "heatmap.hpp"

#include <gtest/gtest.h>

#include <png.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace hm = qkv::heatmap;
using hm::Box;
using hm::Rgb;

constexpr Rgb kTop{253, 231, 37};  // viridis(1)
constexpr Rgb kBottom{68, 1, 84};  // viridis(0)

// A fresh directory for one test, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() / ("qkv_heatmap_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Decodes an 8-bit RGB PNG with libpng's simplified API.
hm::Image read_png(const fs::path& path) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str())) {
    ADD_FAILURE() << "libpng cannot read " << path << ": " << image.message;
    return {};
  }
  image.format = PNG_FORMAT_RGB;
  hm::Image out;
  out.width = static_cast<int>(image.width);
  out.height = static_cast<int>(image.height);
  out.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, out.rgb.data(), 0, nullptr)) {
    ADD_FAILURE() << "libpng cannot decode " << path << ": " << image.message;
    png_image_free(&image);
    return {};
  }
  return out;
}

Rgb pixel(const hm::Image& img, int x, int y) {
  const std::size_t i = (static_cast<std::size_t>(y) * img.width + x) * 3;
  return {img.rgb[i], img.rgb[i + 1], img.rgb[i + 2]};
}

bool dark(Rgb c) { return c.r < 110 && c.g < 110 && c.b < 110; }

int dark_pixels(const hm::Image& img, const Box& b) {
  int n = 0;
  for (int y = b.y; y < b.y + b.h; ++y)
    for (int x = b.x; x < b.x + b.w; ++x) n += dark(pixel(img, x, y)) ? 1 : 0;
  return n;
}

std::string str(Rgb c) {
  return "(" + std::to_string(c.r) + ", " + std::to_string(c.g) + ", " + std::to_string(c.b) + ")";
}

// The centre pixel of cell (i, j) of panel p.
Rgb cell(const hm::Image& img, const hm::Layout& L, int p, int i, int j) {
  const Box& b = L.panels[static_cast<std::size_t>(p)];
  return pixel(img, b.x + j * L.cell_px + L.cell_px / 2, b.y + i * L.cell_px + L.cell_px / 2);
}

// A causal-softmax-like pattern: row i spreads over keys 0..i, weight doubling towards the diagonal.
std::vector<float> causal(std::int64_t n, int shift = 0) {
  std::vector<float> v(static_cast<std::size_t>(n * n), 0.f);
  for (std::int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (std::int64_t j = 0; j <= i; ++j) sum += std::exp2(static_cast<double>(j - i + shift % 3));
    for (std::int64_t j = 0; j <= i; ++j)
      v[static_cast<std::size_t>(i * n + j)] =
          static_cast<float>(std::exp2(static_cast<double>(j - i + shift % 3)) / sum);
  }
  return v;
}

std::vector<hm::Panel> heads(int n_heads, std::int64_t tokens) {
  std::vector<hm::Panel> panels;
  for (int h = 0; h < n_heads; ++h) panels.push_back({"", tokens, tokens, causal(tokens, h)});
  return panels;
}

std::vector<std::string> words(std::int64_t n) {
  const char* base[] = {"the", "cat", "sat", "on", "the", "mat", ".", "supercalifragilistic", "\xc4\xa0tok", "a"};
  std::vector<std::string> out;
  for (std::int64_t i = 0; i < n; ++i) out.push_back(base[i % 10]);
  return out;
}

// Every box drawn: texts, panel frames, the colour bar (with its frame and tick marks).
std::vector<std::pair<std::string, Box>> all_boxes(const hm::Layout& L) {
  std::vector<std::pair<std::string, Box>> out;
  auto add_text = [&](const std::string& what, const hm::Text& t) {
    if (!t.text.empty()) out.emplace_back(what + " '" + t.text + "'", t.box);
  };
  add_text("title", L.title);
  for (std::size_t p = 0; p < L.panels.size(); ++p) {
    const Box& b = L.panels[p];
    out.emplace_back("panel " + std::to_string(p), Box{b.x - 1, b.y - 1, b.w + 2, b.h + 2});
    add_text("panel title", L.panel_titles[p]);
  }
  for (const auto& a : L.row_labels) add_text("row label " + std::to_string(a.index), a.text);
  for (const auto& a : L.col_labels) add_text("col label " + std::to_string(a.index), a.text);
  for (const auto& t : L.axis_captions) add_text("caption", t);
  out.emplace_back("colour bar", Box{L.colorbar.x - 1, L.colorbar.y - 1, L.colorbar.w + 2 + 4, L.colorbar.h + 2});
  for (const auto& t : L.colorbar_ticks) add_text("tick", t.label);
  if (L.has_non_finite) {
    out.emplace_back("swatch", L.non_finite_swatch);
    add_text("non-finite label", L.non_finite_label);
  }
  return out;
}

void expect_no_overlap(const hm::Layout& L, const std::string& what) {
  const auto boxes = all_boxes(L);
  const Box image{0, 0, L.width, L.height};
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    const Box& a = boxes[i].second;
    EXPECT_TRUE(a.x >= 0 && a.y >= 0 && a.x + a.w <= image.w && a.y + a.h <= image.h)
        << what << ": " << boxes[i].first << " leaves the image";
    for (std::size_t j = i + 1; j < boxes.size(); ++j)
      EXPECT_FALSE(a.intersects(boxes[j].second)) << what << ": " << boxes[i].first << " overlaps " << boxes[j].first;
  }
}

// ---- colours and labels ----------------------------------------------------------------------

TEST(Heatmap, ViridisEnds) {
  EXPECT_EQ(hm::viridis(0.0), kBottom);
  EXPECT_EQ(hm::viridis(1.0), kTop);
  EXPECT_EQ(hm::viridis(-3.0), kBottom);
  EXPECT_EQ(hm::viridis(7.0), kTop);
  EXPECT_EQ(hm::viridis(std::nan("")), hm::kNonFinite);
  // Perceptually ordered: luminance rises monotonically along the map.
  double last = -1;
  for (int i = 0; i <= 64; ++i) {
    const Rgb c = hm::viridis(i / 64.0);
    const double lum = 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b;
    EXPECT_GT(lum, last) << "at t = " << i / 64.0;
    last = lum;
  }
}

TEST(Heatmap, DisplayLabel) {
  EXPECT_EQ(hm::display_label("cat"), "cat");
  EXPECT_EQ(hm::display_label("exactly12chr"), "exactly12chr");
  EXPECT_EQ(hm::display_label("supercalifragilistic"), "supercalif..");
  EXPECT_EQ(hm::display_label("supercalifragilistic").size(), hm::kMaxLabelChars);
  EXPECT_EQ(hm::display_label("\xc4\xa0the"), "?the");                   // one '?' per UTF-8 character
  EXPECT_EQ(hm::display_label("na\xc3\xafve \xe2\x80\xa6"), "na?ve ?");  // 2- and 3-byte sequences
  EXPECT_EQ(hm::display_label("a\nb\tc"), "a\\nb\\tc");
  EXPECT_EQ(hm::display_label(std::string("x\0y", 3)), "x?y");
}

// ---- PNG round trip and cell colours ---------------------------------------------------------

TEST(Heatmap, PngRoundTripMatchesRenderedImage) {
  TempDir dir;
  const hm::Image img = hm::render(heads(2, 8), {"round trip", words(8), words(8), 0});
  const fs::path p = dir.path / "rt.png";
  hm::write_png(p, img);
  const hm::Image back = read_png(p);
  ASSERT_EQ(back.width, img.width);
  ASSERT_EQ(back.height, img.height);
  EXPECT_EQ(back.rgb, img.rgb);
  const hm::Layout L = hm::compute_layout(heads(2, 8), {"round trip", words(8), words(8), 0});
  EXPECT_EQ(img.width, L.width);
  EXPECT_EQ(img.height, L.height);
}

TEST(Heatmap, MaxCellIsTopColourAndZeroCellBottomColour) {
  TempDir dir;
  std::vector<float> v(16, 0.25f);
  v[0] = 0.f;          // (0, 0)
  v[1 * 4 + 2] = .8f;  // (1, 2): the maximum
  v[3 * 4 + 3] = .4f;
  const std::vector<hm::Panel> panels{{"only", 4, 4, v}};
  const hm::Options opt{"", {}, {}, 0};
  const hm::Layout L = hm::compute_layout(panels, opt);
  EXPECT_EQ(L.scale_min, 0.0);
  EXPECT_FLOAT_EQ(static_cast<float>(L.scale_max), .8f);
  hm::write_png(dir.path / "c.png", hm::render(panels, opt));
  const hm::Image img = read_png(dir.path / "c.png");
  ASSERT_EQ(img.width, L.width);
  EXPECT_EQ(cell(img, L, 0, 1, 2), kTop) << str(cell(img, L, 0, 1, 2));
  EXPECT_EQ(cell(img, L, 0, 0, 0), kBottom) << str(cell(img, L, 0, 0, 0));
  EXPECT_EQ(cell(img, L, 0, 3, 3), hm::viridis(.5));
  // The whole cell is one colour, corners included.
  const Box& b = L.panels[0];
  for (int dy : {0, L.cell_px - 1})
    for (int dx : {0, L.cell_px - 1}) EXPECT_EQ(pixel(img, b.x + 2 * L.cell_px + dx, b.y + L.cell_px + dy), kTop);
  // The colour bar runs from the top colour to the bottom colour.
  EXPECT_EQ(pixel(img, L.colorbar.x + L.colorbar.w / 2, L.colorbar.y), kTop);
  EXPECT_EQ(pixel(img, L.colorbar.x + L.colorbar.w / 2, L.colorbar.y + L.colorbar.h - 1), kBottom);
}

TEST(Heatmap, SharedScaleAcrossPanels) {
  std::vector<hm::Panel> panels{{"a", 2, 2, {0.f, .5f, .5f, .5f}}, {"b", 2, 2, {.1f, 1.f, .5f, .5f}}};
  const hm::Options opt;
  const hm::Layout L = hm::compute_layout(panels, opt);
  const hm::Image img = hm::render(panels, opt);
  EXPECT_EQ(cell(img, L, 0, 0, 1), hm::viridis(.5));  // .5 of the shared max 1, not of panel a's .5
  EXPECT_EQ(cell(img, L, 1, 0, 1), kTop);
  EXPECT_EQ(cell(img, L, 0, 0, 0), kBottom);
}

TEST(Heatmap, NegativeValuesUseMinMaxScale) {
  std::vector<hm::Panel> panels{{"", 2, 2, {-2.f, 0.f, 1.f, 2.f}}};
  const hm::Layout L = hm::compute_layout(panels, {});
  EXPECT_EQ(L.scale_min, -2.0);
  EXPECT_EQ(L.scale_max, 2.0);
  const hm::Image img = hm::render(panels, {});
  EXPECT_EQ(cell(img, L, 0, 0, 0), kBottom);
  EXPECT_EQ(cell(img, L, 0, 0, 1), hm::viridis(.5));
  EXPECT_EQ(cell(img, L, 0, 1, 1), kTop);
  // Ticks are round values inside the range, top to bottom in pixel order.
  ASSERT_GE(L.colorbar_ticks.size(), 3u);
  for (std::size_t i = 0; i < L.colorbar_ticks.size(); ++i) {
    const auto& t = L.colorbar_ticks[i];
    EXPECT_GE(t.value, -2.0);
    EXPECT_LE(t.value, 2.0);
    EXPECT_GE(t.y, L.colorbar.y);
    EXPECT_LT(t.y, L.colorbar.y + L.colorbar.h);
    if (i > 0) {
      EXPECT_GT(t.value, L.colorbar_ticks[i - 1].value);
      EXPECT_LT(t.y, L.colorbar_ticks[i - 1].y);
    }
  }
  EXPECT_EQ(L.colorbar_ticks.front().label.text, "-2");
  EXPECT_EQ(L.colorbar_ticks.back().label.text, "2");
}

TEST(Heatmap, NonFiniteCellsAreGreyAndExplained) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<hm::Panel> panels{{"", 2, 3, {nan, .5f, 1.f, inf, -inf, 0.f}}};
  const hm::Layout L = hm::compute_layout(panels, {});
  EXPECT_TRUE(L.has_non_finite);
  EXPECT_EQ(L.scale_min, 0.0);
  EXPECT_EQ(L.scale_max, 1.0);
  const hm::Image img = hm::render(panels, {});
  EXPECT_EQ(cell(img, L, 0, 0, 0), hm::kNonFinite);
  EXPECT_EQ(cell(img, L, 0, 1, 0), hm::kNonFinite);
  EXPECT_EQ(cell(img, L, 0, 1, 1), hm::kNonFinite);
  EXPECT_EQ(cell(img, L, 0, 0, 2), kTop);
  EXPECT_EQ(cell(img, L, 0, 1, 2), kBottom);
  ASSERT_FALSE(L.non_finite_swatch.empty());
  const Box& s = L.non_finite_swatch;
  EXPECT_EQ(pixel(img, s.x + s.w / 2, s.y + s.h / 2), hm::kNonFinite);
  EXPECT_GT(dark_pixels(img, L.non_finite_label.box), 0);
  EXPECT_FALSE(hm::compute_layout(heads(1, 3), {}).has_non_finite);
  EXPECT_TRUE(hm::compute_layout(heads(1, 3), {}).non_finite_swatch.empty());
}

TEST(Heatmap, AllEqualOrAllNanStillRenders) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::vector<float>& v : {std::vector<float>{0, 0, 0, 0}, std::vector<float>{nan, nan, nan, nan}}) {
    std::vector<hm::Panel> panels{{"", 2, 2, v}};
    const hm::Layout L = hm::compute_layout(panels, {});
    EXPECT_LT(L.scale_min, L.scale_max);
    EXPECT_NO_THROW(hm::render(panels, {}));
  }
}

// ---- layout ----------------------------------------------------------------------------------

TEST(Heatmap, PanelGridLayout) {
  struct Case {
    int heads, grid_cols, grid_rows;
  };
  for (const Case c : {Case{1, 1, 1}, Case{4, 2, 2}, Case{8, 3, 3}, Case{2, 2, 1}, Case{16, 4, 4}}) {
    SCOPED_TRACE("heads = " + std::to_string(c.heads));
    const hm::Layout L = hm::compute_layout(heads(c.heads, 8), {"grid", words(8), words(8), 0});
    EXPECT_EQ(L.grid_cols, c.grid_cols);
    EXPECT_EQ(L.grid_rows, c.grid_rows);
    ASSERT_EQ(L.panels.size(), static_cast<std::size_t>(c.heads));
    ASSERT_EQ(L.panel_titles.size(), static_cast<std::size_t>(c.heads));
    for (int p = 0; p < c.heads; ++p) {
      const Box& b = L.panels[static_cast<std::size_t>(p)];
      EXPECT_EQ(b.w, 8 * L.cell_px);
      EXPECT_EQ(b.h, 8 * L.cell_px);
      const int gr = p / c.grid_cols, gc = p % c.grid_cols;
      // Row-major: same column -> same x, same row -> same y; left to right, top to bottom.
      EXPECT_EQ(b.x, L.panels[static_cast<std::size_t>(gc)].x);
      EXPECT_EQ(b.y, L.panels[static_cast<std::size_t>(gr * c.grid_cols)].y);
      if (gc > 0) {
        EXPECT_GT(b.x, L.panels[static_cast<std::size_t>(p - 1)].x + b.w);
      }
      if (gr > 0) {
        EXPECT_GT(b.y, L.panels[static_cast<std::size_t>(p - c.grid_cols)].y + b.h);
      }
      EXPECT_EQ(L.panel_titles[static_cast<std::size_t>(p)].text, "head " + std::to_string(p));
      EXPECT_LT(L.panel_titles[static_cast<std::size_t>(p)].box.y + L.panel_titles[static_cast<std::size_t>(p)].box.h,
                b.y);
    }
    // Query labels on the first grid column only; key labels under each panel with nothing below it.
    for (const auto& a : L.row_labels) EXPECT_EQ(a.panel % c.grid_cols, 0);
    for (const auto& a : L.col_labels) EXPECT_GE(a.panel + c.grid_cols, c.heads);
    EXPECT_EQ(L.row_labels.size(), static_cast<std::size_t>(c.grid_rows * 8));
    EXPECT_EQ(L.col_labels.size(), static_cast<std::size_t>(std::min(c.heads, c.grid_cols) * 8));
    // The colour bar is right of every panel and spans them vertically.
    EXPECT_GT(L.colorbar.x, L.panels[static_cast<std::size_t>(std::min(c.heads, c.grid_cols) - 1)].x + 8 * L.cell_px);
    EXPECT_EQ(L.colorbar.y, L.panels.front().y);
    EXPECT_GE(L.colorbar.y + L.colorbar.h, L.panels.back().y + L.panels.back().h);
    expect_no_overlap(L, std::to_string(c.heads) + " heads");
  }
}

TEST(Heatmap, CustomPanelTitlesAndCellSize) {
  std::vector<hm::Panel> panels = heads(2, 4);
  panels[0].title = "L3 H7";
  const hm::Layout L = hm::compute_layout(panels, {"", {}, {}, 10});
  EXPECT_EQ(L.cell_px, 10);
  EXPECT_EQ(L.panels[0].w, 40);
  EXPECT_EQ(L.panel_titles[0].text, "L3 H7");
  EXPECT_EQ(L.panel_titles[1].text, "head 1");
  EXPECT_TRUE(L.title.text.empty());
  expect_no_overlap(L, "cell 10");
}

TEST(Heatmap, LabelsDrawDarkPixelsInLabelRegions) {
  const std::vector<hm::Panel> panels = heads(1, 8);
  const hm::Options opt{"the cat sat on the mat", words(8), words(8), 0};
  const hm::Layout L = hm::compute_layout(panels, opt);
  const hm::Image img = hm::render(panels, opt);
  ASSERT_EQ(L.row_labels.size(), 8u);
  ASSERT_EQ(L.col_labels.size(), 8u);
  for (const auto& a : L.row_labels) {
    EXPECT_FALSE(a.text.vertical);
    EXPECT_EQ(a.text.text, hm::display_label(words(8)[static_cast<std::size_t>(a.index)]));
    EXPECT_LE(a.text.box.x + a.text.box.w, L.panels[0].x);  // left of the cells
    EXPECT_GT(dark_pixels(img, a.text.box), 5) << "row label " << a.index;
  }
  for (const auto& a : L.col_labels) {
    EXPECT_TRUE(a.text.vertical);
    EXPECT_EQ(a.text.box.w, 8 * a.text.scale);  // one glyph high, turned on its side
    EXPECT_EQ(a.text.box.h, static_cast<int>(a.text.text.size()) * 6 * a.text.scale - a.text.scale);
    EXPECT_GE(a.text.box.y, L.panels[0].y + L.panels[0].h);  // under the cells
    EXPECT_GT(dark_pixels(img, a.text.box), 5) << "col label " << a.index;
  }
  EXPECT_EQ(L.col_labels[7].text.text, "supercalif..");
  EXPECT_GT(dark_pixels(img, L.title.box), 50);
  EXPECT_EQ(L.title.box.x, (L.width - L.title.box.w) / 2);  // centred
  for (const auto& t : L.panel_titles) EXPECT_GT(dark_pixels(img, t.box), 10);
  for (const auto& t : L.colorbar_ticks) EXPECT_GT(dark_pixels(img, t.label.box), 5);
  ASSERT_EQ(L.axis_captions.size(), 2u);
  for (const auto& t : L.axis_captions) EXPECT_GT(dark_pixels(img, t.box), 5) << t.text;
  // Text is drawn only inside text boxes: the margin strip at the far left, outside the caption, is white.
  for (int y = 0; y < img.height; ++y) {
    bool in_text = false;
    for (const auto& t : L.axis_captions) in_text = in_text || t.box.contains(2, y);
    if (!in_text) {
      EXPECT_EQ(pixel(img, 2, y), hm::kBackground) << "y = " << y;
    }
  }
}

TEST(Heatmap, VerticalLabelsReadBottomToTop) {
  // Rotated counter-clockwise, the first character sits at the bottom of the box, the last at the top.
  const std::vector<hm::Panel> panels{{"", 1, 1, {1.f}}};
  const hm::Options opt{"", {"q"}, {"|..."}, 40};
  const hm::Layout L = hm::compute_layout(panels, opt);
  const hm::Image img = hm::render(panels, opt);
  ASSERT_EQ(L.col_labels.size(), 1u);
  const Box b = L.col_labels[0].text.box;
  const int s = L.col_labels[0].text.scale;
  // The '|' (first) is a long horizontal stroke in the bottom glyph slot; the '.'s above are small.
  const Box first{b.x, b.y + b.h - 5 * s, b.w, 5 * s};
  const Box last{b.x, b.y, b.w, 5 * s};
  EXPECT_GT(dark_pixels(img, first), dark_pixels(img, last));
  EXPECT_EQ(dark_pixels(img, first), 7 * s * s);  // '|' has 7 inked rows
}

TEST(Heatmap, NoOverlapAt8And64TokensFor1To16Heads) {
  for (std::int64_t tokens : {8, 64}) {
    for (int n = 1; n <= 16; ++n) {
      const std::string what = std::to_string(n) + " heads x " + std::to_string(tokens) + " tokens";
      SCOPED_TRACE(what);
      const hm::Layout L = hm::compute_layout(heads(n, tokens), {"attention", words(tokens), words(tokens), 0});
      expect_no_overlap(L, what);
      EXPECT_GE(L.cell_px, 2);
      // Labels are thinned to every k-th token, starting at 0, and stay separated.
      for (const auto& a : L.row_labels) EXPECT_EQ(a.index % L.row_label_step, 0);
      for (const auto& a : L.col_labels) EXPECT_EQ(a.index % L.col_label_step, 0);
      EXPECT_EQ(L.row_labels.size(),
                static_cast<std::size_t>(L.grid_rows * ((tokens + L.row_label_step - 1) / L.row_label_step)));
      EXPECT_LT(L.width, 1400);
      EXPECT_LT(L.height, 1400);
    }
  }
  // 8 tokens: every token labelled at the larger text scale; 64: thinned.
  const hm::Layout small = hm::compute_layout(heads(1, 8), {"", words(8), words(8), 0});
  EXPECT_EQ(small.row_label_step, 1);
  EXPECT_EQ(small.col_label_step, 1);
  EXPECT_EQ(small.label_scale, 2);
  const hm::Layout big = hm::compute_layout(heads(1, 64), {"", words(64), words(64), 0});
  EXPECT_GT(big.row_label_step, 1);
  EXPECT_LT(big.row_labels.size(), 64u);
}

TEST(Heatmap, NonSquareAndTinyPanelsDoNotOverlap) {
  for (auto [r, c] : {std::pair<std::int64_t, std::int64_t>{1, 64}, {64, 1}, {1, 1}, {3, 40}, {100, 7}}) {
    const std::string what = std::to_string(r) + "x" + std::to_string(c);
    std::vector<hm::Panel> panels(3, hm::Panel{"", r, c, std::vector<float>(static_cast<std::size_t>(r * c), .5f)});
    const hm::Layout L = hm::compute_layout(panels, {"t", words(r), words(c), 0});
    expect_no_overlap(L, what);
    EXPECT_NO_THROW(hm::render(panels, {"t", words(r), words(c), 0})) << what;
  }
}

TEST(Heatmap, InvalidInputThrows) {
  EXPECT_THROW(hm::compute_layout({}, {}), std::invalid_argument);
  EXPECT_THROW(hm::compute_layout({{"", 2, 2, {1, 2, 3}}}, {}), std::invalid_argument);
  EXPECT_THROW(hm::compute_layout({{"", 0, 2, {}}}, {}), std::invalid_argument);
  EXPECT_THROW(hm::compute_layout({{"", 2, 2, {1, 2, 3, 4}}, {"", 1, 4, {1, 2, 3, 4}}}, {}), std::invalid_argument);
  EXPECT_THROW(hm::compute_layout(heads(1, 3), {"", {"a", "b"}, {}, 0}), std::invalid_argument);
  EXPECT_THROW(hm::compute_layout(heads(1, 3), {"", {}, {"a"}, 0}), std::invalid_argument);
  EXPECT_THROW(hm::compute_layout(heads(1, 3), {"", {}, {}, -1}), std::invalid_argument);
  EXPECT_THROW(hm::render(heads(1, 4000), {"", {}, {}, 16}), std::invalid_argument);  // far too big
  try {
    hm::compute_layout({{"", 2, 2, {1, 2, 3}}}, {});
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("3 values for shape [2, 2]"), std::string::npos) << e.what();
  }
}

// ---- writing ---------------------------------------------------------------------------------

TEST(Heatmap, WriteToMissingDirectoryThrowsAndLeavesNoFile) {
  TempDir dir;
  const fs::path p = dir.path / "no_such_dir" / "heat.png";
  const hm::Image img = hm::render(heads(1, 4), {});
  try {
    hm::write_png(p, img);
    FAIL() << "write_png to a missing directory did not throw";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p.parent_path()));
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(Heatmap, FailedRenameRemovesTemporaryFile) {
  TempDir dir;
  const fs::path p = dir.path / "taken";
  fs::create_directories(p / "child");  // rename() onto a non-empty directory fails
  EXPECT_THROW(hm::write_png(p, hm::render(heads(1, 4), {})), std::runtime_error);
  EXPECT_TRUE(fs::is_directory(p));
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++entries;
  EXPECT_EQ(entries, 1) << "a temporary file was left behind";
}

TEST(Heatmap, WriteReplacesExistingFileAtomically) {
  TempDir dir;
  const fs::path p = dir.path / "heat.png";
  hm::write_png(p, hm::render(heads(1, 4), {}));
  const hm::Image second = hm::render(heads(4, 8), {"second", {}, {}, 0});
  hm::write_png(p, second);
  const hm::Image back = read_png(p);
  EXPECT_EQ(back.width, second.width);
  EXPECT_EQ(back.rgb, second.rgb);
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(Heatmap, WriteRejectsMalformedImage) {
  TempDir dir;
  EXPECT_THROW(hm::write_png(dir.path / "x.png", hm::Image{2, 2, std::vector<std::uint8_t>(5)}), std::invalid_argument);
  EXPECT_THROW(hm::write_png(dir.path / "x.png", hm::Image{0, 0, {}}), std::invalid_argument);
  EXPECT_FALSE(fs::exists(dir.path / "x.png"));
}

}  // namespace
