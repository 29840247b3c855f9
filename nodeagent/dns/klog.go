package dns

import (
	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
	"k8s.io/klog/v2"
)

// routeKlog points klog, which is process-wide, at logger. The kubernetes plugin's setup points klog at
// CoreDNS's own logger; left so, every Kubernetes library in the process (the server's too, in `skiff
// dev`) would log in CoreDNS's format to stderr, outside the agent's log level and format.
func routeKlog(logger hclog.Logger) {
	klog.SetLogger(logr.New(&klogSink{logger: logger}))
}

// klogSink is a logr sink over hclog; klog's verbosity levels above 0 are debug messages.
type klogSink struct {
	logger hclog.Logger
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

func (s *klogSink) WithValues(kv ...any) logr.LogSink { return &klogSink{logger: s.logger.With(kv...)} }

func (s *klogSink) WithName(name string) logr.LogSink { return &klogSink{logger: s.logger.Named(name)} }
