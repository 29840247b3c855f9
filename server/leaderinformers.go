package server

import (
	"context"
	"sync"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/cachetransform"
)

// leaderInformers holds the informer factory that the leader services of one term share. Kubernetes runs
// the controller manager and the scheduler as two processes, each with its own watch of every pod and node;
// here both run in the leader's process, and one copy of the cluster's pods serves both.
type leaderInformers struct {
	mu   sync.Mutex
	term context.Context // the term the factory belongs to: its services' context
	cur  *termInformers
}

// termInformers is one term's shared factory and its start gate. The controller manager builds every
// controller before it starts the factory, because Kubernetes' constructors register event handlers before
// they set the fields those handlers read (the disruption controller's); another service that started the
// factory first would run such a handler too early. So the other services register their informers, then
// wait for started before they start the factory themselves (which starts what was registered since).
type termInformers struct {
	factory informers.SharedInformerFactory
	// started is closed once the controller manager has started the factory, or has given up building its
	// controllers, or the term ended.
	started     chan struct{}
	markStarted func()
}

// leaderInformers returns the shared informers of the leader term whose services run with ctx, built by the
// first service that asks. Their lists and watches go through this peer's API as the controller manager,
// whose role reads what the controllers and the scheduler watch. The factory's informers stop with the term.
func (s *Server) leaderInformers(ctx context.Context) (*termInformers, error) {
	s.termInformers.mu.Lock()
	defer s.termInformers.mu.Unlock()
	if s.termInformers.term == ctx {
		return s.termInformers.cur, nil
	}
	cfg, err := s.identityRESTConfig(ctx, controllerManagerIdentity)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "kube-controller-manager/" + s.cfg.Name + "/shared-informers"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	started := make(chan struct{})
	ti := &termInformers{
		// The objects kept are this peer's watch cache's copies (cachetransform.SharedWith): whole, they cost
		// nothing more, where stripping the managed fields would make each a copy of its own.
		factory:     informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(cachetransform.SharedWith(s.shared))),
		started:     started,
		markStarted: sync.OnceFunc(func() { close(started) }),
	}
	s.termInformers.term, s.termInformers.cur = ctx, ti
	context.AfterFunc(ctx, func() {
		ti.markStarted()
		// A peer that no longer leads keeps no copy of the cluster.
		s.termInformers.mu.Lock()
		defer s.termInformers.mu.Unlock()
		if s.termInformers.term == ctx {
			s.termInformers.term, s.termInformers.cur = nil, nil
		}
	})
	return ti, nil
}
