package dns

import (
	"errors"
	"fmt"
	"log"
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

// setup sets the process-wide CoreDNS state once: the directive list and no banner on stdout.
var setup = sync.OnceValue(func() error {
	if err := dnsserver.SetDirectives(Plugins); err != nil {
		return err
	}
	caddy.Quiet, dnsserver.Quiet = true, true
	return nil
})

var (
	// startMu serializes starts and stops: caddy reads the directive list and its registries without locks.
	startMu sync.Mutex
)

// Server is one running CoreDNS instance.
type Server struct {
	inst *caddy.Instance
	once sync.Once
	err  error
}

// Start starts CoreDNS with a rendered Corefile. A Corefile error is a *LineError. CoreDNS's plugins log
// through the standard library's log package, and so do the Kubernetes client libraries (klog), which the
// kubernetes plugin points at CoreDNS's logger: Start sends that package's output to logTo (nil: leaves it
// alone). It is process-wide, like klog: Start is for the node's DNS process, which runs nothing else.
//
// klog is left where the kubernetes plugin points it. Repointing it afterwards would race with the client
// goroutines the plugin has started by then (client-go's client certificate reloader logs at once), which
// klog does not synchronize.
//
// A forwarding loop the loop plugin detects ends the whole process, as it ends a CoreDNS process (see the
// plugin's docs): a node whose resolv.conf points back at the cluster DNS is misconfigured beyond what the
// agent can repair.
func Start(corefile string, logTo hclog.Logger) (*Server, error) {
	if err := setup(); err != nil {
		return nil, err
	}
	startMu.Lock()
	defer startMu.Unlock()
	if logTo != nil {
		log.SetFlags(0)
		log.SetOutput(logTo.StandardWriter(&hclog.StandardLoggerOptions{InferLevels: true}))
	}
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
