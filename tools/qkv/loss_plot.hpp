// Line charts for `qkv train --plot`: the training and validation loss against the step, as a
// PNG (heatmap.hpp's Image and write_png, raster.hpp's font and ticks).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "heatmap.hpp"

namespace qkv::heatmap {

/// One curve: (x, y) points in order of x; non-finite points are left out (the line breaks there).
struct Series {
  std::string label;
  Rgb color;
  std::vector<std::pair<double, double>> points;
  bool markers = false;  // a dot at every point (for sparse series such as a validation loss)
};

/// The series on shared axes (ranges covering every finite point, round ticks), with a legend
/// and the title above; 800 x 480 pixels. Throws std::invalid_argument when no series has a point.
Image render_lines(const std::vector<Series>& series, const std::string& title, const std::string& x_caption,
                   const std::string& y_caption);

}  // namespace qkv::heatmap
