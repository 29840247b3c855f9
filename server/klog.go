package server

import (
	"sync"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
	"k8s.io/klog/v2"
)

var routeKlogOnce sync.Once

// RouteKlog sends the Kubernetes libraries' klog output through the server's hclog logger, so that one
// log stream, with one format and one level setting, comes out of the process. klog is process-global, so
// only the first call counts; tests, which start many servers in one process, leave klog alone.
func RouteKlog(logger hclog.Logger) {
	routeKlogOnce.Do(func() {
		klog.SetLogger(logr.New(&klogSink{logger: logger.Named("k8s")}))
	})
}

// klogSink is a logr sink over hclog. klog's verbosity levels above 0 are debug messages.
type klogSink struct {
	logger hclog.Logger
	name   string
}

func (s *klogSink) Init(logr.RuntimeInfo) {}

func (s *klogSink) Enabled(level int) bool {
	if level > 0 {
		return s.logger.IsDebug()
	}
	return s.logger.IsInfo()
}

func (s *klogSink) Info(level int, msg string, kv ...any) {
	if level > 0 {
		s.logger.Debug(msg, kv...)
		return
	}
	s.logger.Info(msg, kv...)
}

func (s *klogSink) Error(err error, msg string, kv ...any) {
	s.logger.Error(msg, append(kv, "error", err)...)
}

func (s *klogSink) WithValues(kv ...any) logr.LogSink {
	return &klogSink{logger: s.logger.With(kv...), name: s.name}
}

func (s *klogSink) WithName(name string) logr.LogSink {
	return &klogSink{logger: s.logger.Named(name), name: name}
}
