package server

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"k8s.io/klog/v2"

	"github.com/skiff-dev/skiff/internal/hclogr"
)

var routeKlogOnce sync.Once

// RouteKlog sends the Kubernetes libraries' klog output through the server's hclog logger, so that one
// log stream, with one format and one level setting, comes out of the process. klog is process-global, so
// only the first call counts; tests, which start many servers in one process, leave klog alone.
func RouteKlog(logger hclog.Logger) {
	routeKlogOnce.Do(func() {
		klog.SetLogger(hclogr.New(logger.Named("k8s")))
	})
}

// stopping is set once a server in this process has begun to shut down.
var stopping atomic.Bool

func init() { klog.OsExit = exitUnlessStopping }

// exitUnlessStopping is klog's exit, which Fatal calls. k8s.io/apiserver treats a failed post-start hook as
// fatal, and a server stopped while it still starts fails some on purpose: their informers have stopped
// ("priority-and-fairness-config-producer ... was not added to shared informer because it has stopped
// already"). That turned an ordered stop into exit status 255. Once a shutdown has begun, a fatal ends only
// the goroutine that logged it (its deferred calls run), and the shutdown finishes with its own status.
func exitUnlessStopping(code int) {
	if stopping.Load() {
		runtime.Goexit()
	}
	os.Exit(code)
}
