#include "engine/step.hpp"  // placeholder
