package apiserver_test

import (
	"testing"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestMain stops the server the integration tests share (servertest.Shared) after them.
func TestMain(m *testing.M) { servertest.Main(m) }
