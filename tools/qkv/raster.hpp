// Drawing primitives of the CLI's pictures (the attention heatmap, the training loss curve):
// text in font.hpp's 5x8 bitmap font, round axis ticks, and a canvas of RGB pixels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "font.hpp"
#include "heatmap.hpp"

namespace qkv::heatmap {

inline int text_width(std::string_view s, int scale) {
  return s.empty() ? 0 : static_cast<int>(s.size()) * font::kAdvance * scale - scale;
}
inline int text_height(int scale) { return font::kGlyphHeight * scale; }

inline Text make_text(std::string s, int x, int y, int scale, bool vertical) {
  Text t;
  const int len = text_width(s, scale);
  t.box = vertical ? Box{x, y, text_height(scale), len} : Box{x, y, len, text_height(scale)};
  t.text = std::move(s);
  t.scale = scale;
  t.vertical = vertical;
  return t;
}

/// Round tick values covering [lo, hi]: steps of 1, 2, 2.5 or 5 times a power of ten, about 4 of them.
inline std::vector<double> nice_ticks(double lo, double hi, int* decimals) {
  const double span = hi - lo;
  const double raw = span / 4;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double f = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10;
  const double step = f * mag;
  *decimals = std::clamp(static_cast<int>(-std::floor(std::log10(step) + 1e-9)) + (f == 2.5 ? 1 : 0), 0, 8);
  std::vector<double> ticks;
  const double first = std::ceil(lo / step - 1e-9);
  for (int i = 0; i < 64; ++i) {
    double v = (first + i) * step;
    if (v > hi + step * 1e-9) break;
    if (std::fabs(v) < step * 1e-9) v = 0;
    ticks.push_back(v);
  }
  return ticks;
}

inline std::string format_tick(double v, int decimals, double magnitude) {
  char buf[64];
  if (magnitude >= 1e6 || (magnitude > 0 && magnitude < 1e-4)) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  }
  return buf;
}

/// Pixels of an Image being drawn; writes outside it are dropped.
struct Canvas {
  int width, height;
  std::vector<std::uint8_t>& rgb;

  void put(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= width || y >= height) return;
    const std::size_t i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width) + x) * 3;
    rgb[i] = c.r;
    rgb[i + 1] = c.g;
    rgb[i + 2] = c.b;
  }
  void fill(const Box& b, Rgb c) {
    const int x0 = std::max(b.x, 0), x1 = std::min(b.x + b.w, width);
    const int y0 = std::max(b.y, 0), y1 = std::min(b.y + b.h, height);
    for (int y = y0; y < y1; ++y)
      for (int x = x0; x < x1; ++x) put(x, y, c);
  }
  // A 1-pixel rectangle just outside b.
  void frame(const Box& b, Rgb c) {
    fill({b.x - 1, b.y - 1, b.w + 2, 1}, c);
    fill({b.x - 1, b.y + b.h, b.w + 2, 1}, c);
    fill({b.x - 1, b.y, 1, b.h}, c);
    fill({b.x + b.w, b.y, 1, b.h}, c);
  }
  void text(const Text& t, Rgb c) {
    const int s = t.scale;
    const int len = text_width(t.text, s);
    for (std::size_t i = 0; i < t.text.size(); ++i) {
      for (int gy = 0; gy < font::kGlyphHeight; ++gy) {
        for (int gx = 0; gx < font::kGlyphWidth; ++gx) {
          if (!font::ink(t.text[i], gx, gy)) continue;
          // Top-left of this font pixel in unrotated text coordinates.
          const int tx = static_cast<int>(i) * font::kAdvance * s + gx * s;
          const int ty = gy * s;
          if (t.vertical) {  // 90 degrees counter-clockwise: (tx, ty) -> (ty, len - 1 - tx)
            fill({t.box.x + ty, t.box.y + len - tx - s, s, s}, c);
          } else {
            fill({t.box.x + tx, t.box.y + ty, s, s}, c);
          }
        }
      }
    }
  }
};

}  // namespace qkv::heatmap
