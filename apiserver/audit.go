package apiserver

import (
	"fmt"

	"gopkg.in/natefinch/lumberjack.v2"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/apiserver/pkg/audit/policy"
	genericapiserver "k8s.io/apiserver/pkg/server"
	auditlog "k8s.io/apiserver/plugin/pkg/audit/log"
)

// AuditConfig turns on the API's audit log, as kube-apiserver's --audit-log-path and --audit-policy-file do:
// the library's audit filter records what Kubernetes' audit policy selects, as JSON lines of
// audit.k8s.io/v1 Events in a file rotated by size.
type AuditConfig struct {
	Path, PolicyFile            string
	MaxAge, MaxBackups, MaxSize int // days, files, megabytes; 0 keeps everything
}

// setupAudit sets the generic server's audit backend and policy.
func setupAudit(cfg *genericapiserver.Config, a *AuditConfig) error {
	p, err := policy.LoadPolicyFromFile(a.PolicyFile)
	if err != nil {
		return fmt.Errorf("audit policy: %w", err)
	}
	cfg.AuditPolicyRuleEvaluator = policy.NewPolicyRuleEvaluator(p)
	out := &lumberjack.Logger{Filename: a.Path, MaxAge: a.MaxAge, MaxBackups: a.MaxBackups, MaxSize: a.MaxSize}
	cfg.AuditBackend = auditlog.NewBackend(out, auditlog.FormatJson, auditv1.SchemeGroupVersion)
	return nil
}
