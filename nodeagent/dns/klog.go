package dns

import (
	"github.com/hashicorp/go-hclog"
	"k8s.io/klog/v2"

	"github.com/skiff-dev/skiff/internal/hclogr"
)

// routeKlog points klog, which is process-wide, at logger. The kubernetes plugin's setup points klog at
// CoreDNS's own logger; left so, the Kubernetes libraries would log in CoreDNS's format to stderr, outside
// the process's log level and format.
func routeKlog(logger hclog.Logger) {
	klog.SetLogger(hclogr.New(logger))
}
