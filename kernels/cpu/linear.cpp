#include "kernels/cpu/linear.hpp"  // placeholder: implemented by the kernels work
