package bench

import (
	"os"
	"testing"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// TestMain removes the skiff binary the tests built (when SKIFF_BIN did not name one).
func TestMain(m *testing.M) {
	code := m.Run()
	proctest.RemoveBuiltBinary()
	os.Exit(code)
}
