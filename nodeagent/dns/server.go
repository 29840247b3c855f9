package dns

import (
	"errors"
	"fmt"
	"sync"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/hashicorp/go-hclog"

	// The embedded plugins; each registers itself with caddy when imported. Keep in step with Plugins.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
)

// setup sets the process-wide CoreDNS state once: the directive list, no banner on stdout, and the hook
// that takes klog back from the kubernetes plugin.
var setup = sync.OnceValue(func() error {
	if err := dnsserver.SetDirectives(Plugins); err != nil {
		return err
	}
	caddy.Quiet, dnsserver.Quiet = true, true
	// The kubernetes plugin's setup points klog (process-wide) at CoreDNS's logger. This callback runs right
	// after that setup and before the plugin starts its informers, so the informers never log while klog is
	// being repointed.
	caddy.RegisterParsingCallback("dns", "kubernetes", func(caddy.Context) error {
		if klogTarget != nil {
			routeKlog(klogTarget)
		}
		return nil
	})
	return nil
})

var (
	// startMu serializes starts and stops: caddy reads the directive list and its registries without locks.
	startMu sync.Mutex
	// klogTarget is the logger klog goes to once the kubernetes plugin is set up; under startMu.
	klogTarget hclog.Logger
)

// Server is one running CoreDNS instance.
type Server struct {
	inst *caddy.Instance
	once sync.Once
	err  error
}

// Start starts CoreDNS with a rendered Corefile. A Corefile error is a *LineError. The Kubernetes client
// libraries' log (klog, process-wide) goes to klogTo afterwards (nil: where CoreDNS points it); CoreDNS's
// own plugins log through the standard library's log package.
//
// klog is repointed (by the kubernetes plugin, then here) while the process may already log through it (the
// agent's informers run), which klog does not synchronize: the race detector reports it when Start runs
// beside other klog users, so the tests run CoreDNS in a child process. The write is one pointer.
//
// A forwarding loop the loop plugin detects ends the whole process, as it ends a CoreDNS process (see the
// plugin's docs): a node whose resolv.conf points back at the cluster DNS is misconfigured beyond what the
// agent can repair.
func Start(corefile string, klogTo hclog.Logger) (*Server, error) {
	if err := setup(); err != nil {
		return nil, err
	}
	startMu.Lock()
	defer startMu.Unlock()
	klogTarget = klogTo
	inst, err := caddy.Start(caddy.CaddyfileInput{Filepath: "Corefile", Contents: []byte(corefile), ServerTypeName: "dns"})
	if err != nil {
		if inst != nil {
			stop(inst)
		}
		return nil, lineError(err)
	}
	return &Server{inst: inst}, nil
}

// Stop shuts the instance down (its plugins' shutdown hooks, then its listeners) and waits for it. It is
// safe to call more than once.
func (s *Server) Stop() error {
	s.once.Do(func() {
		startMu.Lock()
		defer startMu.Unlock()
		s.err = stop(s.inst)
	})
	return s.err
}

func stop(inst *caddy.Instance) error {
	shutdownErr := errors.Join(inst.ShutdownCallbacks()...)
	stopErr := inst.Stop()
	inst.Wait()
	if err := errors.Join(shutdownErr, stopErr); err != nil {
		return fmt.Errorf("stopping CoreDNS: %w", err)
	}
	return nil
}
