// Line charts: see loss_plot.hpp.
#include "loss_plot.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "raster.hpp"

namespace qkv::heatmap {
namespace {

constexpr int kWidth = 800, kHeight = 480;
constexpr int kLeft = 90, kRight = 24, kTop = 48, kBottom = 64;  // the plot area's margins
constexpr Rgb kInk{25, 25, 25}, kGrid{225, 225, 225}, kFrame{70, 70, 70};

/// A line from (x0, y0) to (x1, y1), `thick` pixels wide (a square brush along a DDA walk).
void line(Canvas& c, double x0, double y0, double x1, double y1, int thick, Rgb color) {
  const int n = static_cast<int>(std::ceil(std::max(std::fabs(x1 - x0), std::fabs(y1 - y0)))) + 1;
  for (int i = 0; i <= n; ++i) {
    const double t = static_cast<double>(i) / n;
    const int x = static_cast<int>(std::lround(x0 + t * (x1 - x0))) - thick / 2;
    const int y = static_cast<int>(std::lround(y0 + t * (y1 - y0))) - thick / 2;
    c.fill({x, y, thick, thick}, color);
  }
}

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  /// Widened to a non-empty span.
  void settle(double pad) {
    if (hi - lo <= 0) {
      const double w = std::max(std::fabs(lo) * 0.05, 1e-3);
      lo -= w;
      hi += w;
    }
    const double p = (hi - lo) * pad;
    lo -= p;
    hi += p;
  }
};

}  // namespace

Image render_lines(const std::vector<Series>& series, const std::string& title, const std::string& x_caption,
                   const std::string& y_caption) {
  Range xr, yr;
  for (const Series& s : series)
    for (const auto& [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) {
        xr.add(x);
        yr.add(y);
      }
  if (!(xr.lo <= xr.hi)) throw std::invalid_argument("plot: no finite point to draw");
  xr.settle(0.0);
  yr.settle(0.05);

  Image img;
  img.width = kWidth;
  img.height = kHeight;
  img.rgb.assign(static_cast<std::size_t>(kWidth) * kHeight * 3, 255);
  Canvas c{kWidth, kHeight, img.rgb};
  const Box area{kLeft, kTop, kWidth - kLeft - kRight, kHeight - kTop - kBottom};
  auto px = [&](double x) { return area.x + (x - xr.lo) / (xr.hi - xr.lo) * (area.w - 1); };
  auto py = [&](double y) { return area.y + area.h - 1 - (y - yr.lo) / (yr.hi - yr.lo) * (area.h - 1); };

  // Grid lines and tick labels.
  int decimals = 0;
  for (double v : nice_ticks(yr.lo, yr.hi, &decimals)) {
    const int y = static_cast<int>(std::lround(py(v)));
    c.fill({area.x, y, area.w, 1}, kGrid);
    const std::string label = format_tick(v, decimals, std::max(std::fabs(yr.lo), std::fabs(yr.hi)));
    c.text(make_text(label, area.x - 8 - text_width(label, 2), y - text_height(2) / 2, 2, false), kInk);
  }
  for (double v : nice_ticks(xr.lo, xr.hi, &decimals)) {
    const int x = static_cast<int>(std::lround(px(v)));
    c.fill({x, area.y, 1, area.h}, kGrid);
    const std::string label = format_tick(v, decimals, std::max(std::fabs(xr.lo), std::fabs(xr.hi)));
    c.text(make_text(label, x - text_width(label, 2) / 2, area.y + area.h + 8, 2, false), kInk);
  }
  c.frame(area, kFrame);
  c.text(make_text(title, (kWidth - text_width(title, 2)) / 2, 14, 2, false), kInk);
  c.text(make_text(x_caption, area.x + (area.w - text_width(x_caption, 2)) / 2, kHeight - 26, 2, false), kInk);
  c.text(make_text(y_caption, 12, area.y + (area.h - text_width(y_caption, 2)) / 2, 2, true), kInk);

  // The curves, then the legend in the top right corner of the plot area.
  for (const Series& s : series) {
    const std::pair<double, double>* prev = nullptr;
    for (const auto& p : s.points) {
      if (!std::isfinite(p.first) || !std::isfinite(p.second)) {
        prev = nullptr;
        continue;
      }
      if (prev) line(c, px(prev->first), py(prev->second), px(p.first), py(p.second), 2, s.color);
      if (s.markers)
        c.fill({static_cast<int>(std::lround(px(p.first))) - 3, static_cast<int>(std::lround(py(p.second))) - 3, 7, 7},
               s.color);
      prev = &p;
    }
  }
  int ly = area.y + 10;
  for (const Series& s : series) {
    const int w = text_width(s.label, 2);
    const int x = area.x + area.w - w - 16;
    c.fill({x - 34, ly + text_height(2) / 2 - 1, 26, 3}, s.color);
    c.text(make_text(s.label, x, ly, 2, false), kInk);
    ly += text_height(2) + 8;
  }
  return img;
}

}  // namespace qkv::heatmap
