// Hand-made joint graphs shared by the tagging, remat and plan tests.
#pragma once

#include "graph_builder.h"

namespace hyper_ac::testing {

// The names of nodes given by index, in order.
inline std::vector<std::string> names(const Graph& g, const std::vector<std::int32_t>& indices) {
  std::vector<std::string> out;
  for (auto i : indices) out.push_back(g.nodes[static_cast<std::size_t>(i)].name);
  return out;
}

// Two transformer-like units (layers.0, layers.1) with an MLP each and a head.
//   mm_i = mm(in, w_i) @layers.i.mlp; relu_i = relu(mm_i) @layers.i.mlp; mul_i = mul(relu_i, relu_i) @layers.i
inline GraphBuilder two_units(bool with_model = true) {
  GraphBuilder b;
  b.placeholder("x", "input").placeholder("w0", "parameter").placeholder("w1", "parameter");
  b.op("mm0", "aten::mm.default", {"x", "w0"}, "layers.0.mlp")
      .op("relu0", "aten::relu.default", {"mm0"}, "layers.0.mlp")
      .op("mul0", "aten::mul.Tensor", {"relu0"}, "layers.0")
      .op("mm1", "aten::mm.default", {"mul0", "w1"}, "layers.1.mlp")
      .op("relu1", "aten::relu.default", {"mm1"}, "layers.1.mlp")
      .op("mul1", "aten::mul.Tensor", {"relu1"}, "layers.1")
      .op("loss", "aten::sum.default", {"mul1"});
  b.placeholder("tangent", "tangent", 4, "backward");
  b.bwd("g_mul1", "aten::mul.Tensor", {"tangent", "relu1"})
      .bwd("g_relu1", "aten::threshold_backward.default", {"g_mul1", "relu1"})
      .bwd("g_w1", "aten::mm.default", {"mul0", "g_relu1"})
      .bwd("g_mul0", "aten::mm.default", {"g_relu1", "w1"})
      .bwd("g_relu0", "aten::threshold_backward.default", {"g_mul0", "relu0"})
      .bwd("g_w0", "aten::mm.default", {"x", "g_relu0"})
      .output({"loss", "g_w0", "g_w1"});
  if (with_model)
    b.model("Net",
            {{"layers.0", "Block"}, {"layers.0.mlp", "MLP"}, {"layers.1", "Block"}, {"layers.1.mlp", "MLP"}},
            {{"layers.0", "Block"}, {"layers.1", "Block"}});
  return b;
}

inline const char* kSelective = R"({"ac_mode": "selective"})";
inline const char* kFull = R"({"ac_mode": "full"})";

inline const char* kTable = R"({"must_save": ["aten::mm", "aten::addmm"], "must_recompute": ["aten::topk"],
  "saved_collectives": ["_c10d_functional::all_to_all_single"],
  "all_gathers": ["_c10d_functional::all_gather_into_tensor"],
  "transparent": ["operator.getitem", "_c10d_functional::wait_tensor"]})";

}  // namespace hyper_ac::testing
