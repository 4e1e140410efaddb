// A minimal unit-test harness for the C++ kernels: TEST_CASE registers a function, EXPECT*
// record failures, run_all_tests() runs every case and returns the process exit code.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace sopfast::test {

struct TestCase {
  const char* name;
  void (*run)();
};

inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> cases;
  return cases;
}

inline int& failure_count() {
  static int failures = 0;
  return failures;
}

struct Registration {
  Registration(const char* name, void (*run)()) { registry().push_back({name, run}); }
};

inline void report_failure(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what);
  ++failure_count();
}

inline int run_all_tests() {
  for (const TestCase& test : registry()) {
    const int before = failure_count();
    test.run();
    std::printf("%s %s\n", failure_count() == before ? "PASS" : "FAIL", test.name);
  }
  std::printf("%zu cases, %d failed checks\n", registry().size(), failure_count());
  return failure_count() == 0 ? 0 : 1;
}

}  // namespace sopfast::test

#define TEST_CASE(name)                                                         \
  static void name();                                                           \
  static const sopfast::test::Registration name##_registration(#name, &(name)); \
  static void name()

#define EXPECT(cond)                                                       \
  do {                                                                     \
    if (!(cond)) sopfast::test::report_failure(__FILE__, __LINE__, #cond); \
  } while (0)

#define EXPECT_NEAR(a, b, tol)                                         \
  do {                                                                 \
    if (!(std::fabs(double(a) - double(b)) <= double(tol)))            \
      sopfast::test::report_failure(__FILE__, __LINE__, #a " ~= " #b); \
  } while (0)

// The statement must throw (torch's TORCH_CHECK throws c10::Error, a std::exception).
#define EXPECT_THROWS(stmt)                                                          \
  do {                                                                               \
    bool threw = false;                                                              \
    try {                                                                            \
      stmt;                                                                          \
    } catch (const std::exception&) {                                                \
      threw = true;                                                                  \
    }                                                                                \
    if (!threw) sopfast::test::report_failure(__FILE__, __LINE__, "throws: " #stmt); \
  } while (0)

// The statement must throw an `Error` (e.g. c10::ValueError, a ValueError in Python) whose message
// holds `text`.
#define EXPECT_THROWS_WITH(stmt, Error, text)                                                           \
  do {                                                                                                  \
    bool matched = false;                                                                               \
    try {                                                                                               \
      stmt;                                                                                             \
    } catch (const Error& error) {                                                                      \
      matched = std::string(error.what()).find(text) != std::string::npos;                              \
    } catch (const std::exception&) {                                                                   \
    }                                                                                                   \
    if (!matched) sopfast::test::report_failure(__FILE__, __LINE__, "throws " #Error " with " #text ": " #stmt); \
  } while (0)

#define TEST_MAIN() \
  int main() { return sopfast::test::run_all_tests(); }
