package server

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/controller"
)

// systemNamespaces exist in every cluster, as in Kubernetes.
var systemNamespaces = []string{metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease}

// leaderLeaseName is the Lease in kube-system through which the Raft leader says who leads.
const leaderLeaseName = "skiff-leader"

// leaseRenewInterval is how often the leader renews its Lease; the Lease says it is valid for three times
// as long.
const leaseRenewInterval = 5 * time.Second

// runSystemObjects is a leader service: through the API, as any component would, it creates the system
// namespaces and keeps the leader Lease current.
func (s *Server) runSystemObjects(ctx context.Context) {
	client, err := s.adminClient(ctx)
	if err != nil {
		return
	}
	for _, name := range systemNamespaces {
		for ctx.Err() == nil {
			_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			if err == nil || apierrors.IsAlreadyExists(err) {
				break
			}
			s.logger.Warn("creating system namespace", "namespace", name, "error", err)
			sleepCtx(ctx, time.Second)
		}
	}
	acquired := metav1.NewMicroTime(time.Now())
	first := true
	for ctx.Err() == nil {
		if err := s.renewLeaderLease(ctx, client, acquired, first); err != nil {
			s.logger.Warn("renewing the leader lease", "error", err)
		} else {
			first = false
		}
		sleepCtx(ctx, leaseRenewInterval)
	}
}

func (s *Server) renewLeaderLease(ctx context.Context, client kubernetes.Interface, acquired metav1.MicroTime, first bool) error {
	leases := client.CoordinationV1().Leases(metav1.NamespaceSystem)
	now := metav1.NewMicroTime(time.Now())
	holder := s.cfg.Name
	duration := int32(3 * leaseRenewInterval / time.Second)
	lease, err := leases.Get(ctx, leaderLeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: leaderLeaseName, Namespace: metav1.NamespaceSystem},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration,
				AcquireTime: &acquired, RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if first && (lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != holder) {
		transitions := int32(0)
		if lease.Spec.LeaseTransitions != nil {
			transitions = *lease.Spec.LeaseTransitions
		}
		transitions++
		lease.Spec.LeaseTransitions = &transitions
		lease.Spec.AcquireTime = &acquired
	}
	lease.Spec.HolderIdentity = &holder
	lease.Spec.LeaseDurationSeconds = &duration
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// runControllers is a leader service: the controller manager, through this peer's API.
func (s *Server) runControllers(ctx context.Context) {
	cfg, err := s.adminRESTConfig(ctx)
	if err != nil {
		return
	}
	clients, err := controller.NewClients(cfg, s.logger.Named("controller"))
	if err != nil {
		s.logger.Error("building controller clients", "error", err)
		return
	}
	controller.Run(ctx, clients)
}

func (s *Server) adminRESTConfig(ctx context.Context) (*rest.Config, error) {
	for {
		cfg, err := clientcmd.BuildConfigFromFlags("", s.KubeconfigPath())
		if err == nil {
			cfg.UserAgent = "skiff-leader/" + s.cfg.Name
			// The controllers talk to their own peer; client-go's default of 5 requests a second would
			// make each garbage collection round take seconds.
			cfg.QPS, cfg.Burst = 200, 400
			return cfg, nil
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
}

// adminClient waits for this peer's admin kubeconfig and returns a client for it. Leader services reach the
// API through this peer, as the design asks.
func (s *Server) adminClient(ctx context.Context) (kubernetes.Interface, error) {
	cfg, err := s.adminRESTConfig(ctx)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// sleepCtx sleeps for d, or less if ctx ends; it reports whether ctx is still alive.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
