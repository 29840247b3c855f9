package server

import (
	"sync"

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
