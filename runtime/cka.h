// runtime/cka.h: linear centered kernel alignment (CKA, Kornblith et al. 2019), the similarity
// of two sets of hidden states taken over the same n inputs, and the matrix of it between two
// lists of states (e.g. the layers of two models, or of two streams of one model).
#ifndef SATDAR_RUNTIME_CKA_H_
#define SATDAR_RUNTIME_CKA_H_

#include <cstdint>
#include <vector>

namespace satdar::runtime {

// Linear CKA between x (n rows x p features, row-major) and y (n rows x q features, row-major),
// the rows of both being the same n examples. Every column is centred over the n rows, then
//   CKA = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F * ||Yc^T Yc||_F),
// computed in the feature-space form (p x p, q x q and p x q cross products, O(n p q) work,
// accumulated in double). The result lies in [0, 1] and is invariant to an orthogonal transform
// or an isotropic scaling of either side's features.
//
// Returns NaN when either denominator is 0: a constant state (every row the same; a column whose
// values are all equal is centred to exactly 0), n < 2, or p or q < 1. NaN or infinite inputs
// give NaN.
double LinearCka(const double* x, const double* y, int64_t n, int p, int q);

// Linear CKA of every pair: element (i, j) of the row-major |a| x |b| result is
// LinearCka(a[i], b[j], n, d, d). Every state is n x d, row-major. Each distinct state (by
// pointer; a and b may share them) is centred and its self norm ||Xc^T Xc||_F computed once, and
// the cross term of a pair is computed once even when it occurs as (i, j) and (j, i), so the
// matrix costs O(|a| |b| n d^2) plus O((|a| + |b|) n d^2) for the self terms. It keeps a centred
// copy of every distinct state (n d doubles each).
std::vector<double> CkaMatrix(const std::vector<const double*>& a,
                              const std::vector<const double*>& b, int64_t n, int d);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_CKA_H_
