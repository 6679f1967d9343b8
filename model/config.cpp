#include "model/config.hpp"  // placeholder
