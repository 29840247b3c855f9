package apiserver_test

import (
	"testing"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestMain stops the servers the package's tests share (servertest.Shared, apiserver.SharedTestAPI) after them.
func TestMain(m *testing.M) { servertest.Main(m, apiserver.StopSharedTestAPI) }
