// Package e2e holds process-level tests: real `skiff` binaries on loopback addresses, driven through their
// operator commands as an operator would. Set SKIFF_BIN to test a prebuilt binary; otherwise the tests build
// one.
package e2e
