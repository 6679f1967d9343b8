#include "kernels/cpu/attention.hpp"  // placeholder: implemented by the kernels work
