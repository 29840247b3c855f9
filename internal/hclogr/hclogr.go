// Package hclogr adapts an hclog logger to logr, the interface klog (the Kubernetes libraries' log) writes
// to, so that a Skiff process has one log stream with one format and one level setting.
package hclogr

import (
	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
)

// New returns a logr logger over logger. klog's verbosity levels above 0 are debug messages.
func New(logger hclog.Logger) logr.Logger { return logr.New(&sink{logger: logger}) }

type sink struct {
	logger hclog.Logger
}

func (s *sink) Init(logr.RuntimeInfo) {}

func (s *sink) Enabled(level int) bool {
	if level > 0 {
		return s.logger.IsDebug()
	}
	return s.logger.IsInfo()
}

func (s *sink) Info(level int, msg string, kv ...any) {
	if level > 0 {
		s.logger.Debug(msg, kv...)
		return
	}
	s.logger.Info(msg, kv...)
}

func (s *sink) Error(err error, msg string, kv ...any) {
	s.logger.Error(msg, append(kv, "error", err)...)
}

func (s *sink) WithValues(kv ...any) logr.LogSink { return &sink{logger: s.logger.With(kv...)} }

func (s *sink) WithName(name string) logr.LogSink { return &sink{logger: s.logger.Named(name)} }
