#include <algorithm>
#include <cmath>

#include "model/variants/transparent_ops.h"

namespace satdar::model::cpu {

template <typename T>
void DepthSoftmaxForward(T* a, const T* z, int count) {
  if (count <= 0) return;
  const double top = static_cast<double>(*std::max_element(z, z + count));
  double sum = 0;
  for (int i = 0; i < count; ++i) sum += std::exp(static_cast<double>(z[i]) - top);
  for (int i = 0; i < count; ++i) {
    a[i] = static_cast<T>(std::exp(static_cast<double>(z[i]) - top) / sum);
  }
}

template <typename T>
void DepthSoftmaxBackward(T* grad_z, const T* a, const T* grad_a, int count) {
  double dot = 0;
  for (int i = 0; i < count; ++i) dot += static_cast<double>(a[i]) * grad_a[i];
  for (int i = 0; i < count; ++i) {
    grad_z[i] += static_cast<T>(static_cast<double>(a[i]) * (grad_a[i] - dot));
  }
}

template void DepthSoftmaxForward<float>(float*, const float*, int);
template void DepthSoftmaxForward<double>(double*, const double*, int);
template void DepthSoftmaxBackward<float>(float*, const float*, const float*, int);
template void DepthSoftmaxBackward<double>(double*, const double*, const double*, int);

}  // namespace satdar::model::cpu
