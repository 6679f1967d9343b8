// The source the test programs' shared precompiled header is built with
// (tests/CMakeLists.txt, shardline_test_pch); it holds nothing itself.
