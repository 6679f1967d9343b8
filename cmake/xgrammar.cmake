# xgrammar's C++ core (Apache-2.0; the grammar engine of vLLM, SGLang and
# TensorRT-LLM) for structured outputs (issue 43): JSON schema, regex,
# EBNF and choice constraints compiled to token masks.
#
# Taken by package name from PyPI: its source distribution, pinned by
# version and sha256, downloaded at configure time into
# ~/.cache/shardline/src (reused by later builds on the machine). The
# sdist carries its third-party headers (dlpack 1.0, the picojson fork with
# ordered keys), so nothing else is fetched. Its own CMakeLists is not
# used: it forces the Python bindings on (cmake/config.cmake sets
# XGRAMMAR_BUILD_PYTHON_BINDINGS ON as a normal variable, so
# -D...=OFF is ignored), -Werror and -flto. The target below builds the
# same sources (cpp/*.cc without cpp/tvm_ffi/, the bindings) as their
# `xgrammar` static library does, C++17 as upstream.
include(FetchContent)
set(SHARDLINE_XGRAMMAR_VERSION 0.2.9)
set(SHARDLINE_XGRAMMAR_SHA256 87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90)
set(SHARDLINE_XGRAMMAR_URL
    "https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${SHARDLINE_XGRAMMAR_VERSION}.tar.gz")
if(DEFINED ENV{HOME})
  set(SHARDLINE_XGRAMMAR_DOWNLOAD_DIR "$ENV{HOME}/.cache/shardline/src")
else()
  set(SHARDLINE_XGRAMMAR_DOWNLOAD_DIR "${CMAKE_BINARY_DIR}/_downloads")
endif()
FetchContent_Declare(xgrammar
  URL "${SHARDLINE_XGRAMMAR_URL}"
  URL_HASH SHA256=${SHARDLINE_XGRAMMAR_SHA256}
  DOWNLOAD_DIR "${SHARDLINE_XGRAMMAR_DOWNLOAD_DIR}"
  DOWNLOAD_NO_EXTRACT FALSE)
FetchContent_GetProperties(xgrammar)
if(NOT xgrammar_POPULATED)
  FetchContent_Populate(xgrammar)
endif()

file(GLOB_RECURSE SHARDLINE_XGRAMMAR_SOURCES CONFIGURE_DEPENDS ${xgrammar_SOURCE_DIR}/cpp/*.cc)
list(FILTER SHARDLINE_XGRAMMAR_SOURCES EXCLUDE REGEX "/cpp/tvm_ffi/")
# Its log goes to Shardline's sink (sampling/structured_output/xgrammar_log.cpp):
# fatal messages throw, warnings are captured per compile.
add_library(shardline_xgrammar STATIC ${SHARDLINE_XGRAMMAR_SOURCES}
            ${CMAKE_SOURCE_DIR}/sampling/structured_output/xgrammar_log.cpp)
set_target_properties(shardline_xgrammar PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                                                    POSITION_INDEPENDENT_CODE ON)
# Third-party code: its warnings are upstream's, not ours.
target_compile_options(shardline_xgrammar PRIVATE -w)
target_include_directories(shardline_xgrammar SYSTEM PUBLIC ${xgrammar_SOURCE_DIR}/include
                           ${xgrammar_SOURCE_DIR}/3rdparty/dlpack/include)
target_include_directories(shardline_xgrammar SYSTEM PRIVATE ${xgrammar_SOURCE_DIR}/3rdparty/picojson)
target_compile_definitions(shardline_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0
                           XGRAMMAR_LOG_CUSTOMIZE=1)
target_include_directories(shardline_xgrammar PRIVATE ${CMAKE_SOURCE_DIR})
target_link_libraries(shardline_xgrammar PUBLIC Threads::Threads)
