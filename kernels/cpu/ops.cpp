#include "kernels/cpu/ops.hpp"  // placeholder: implemented by the kernels work
