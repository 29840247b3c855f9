package controller

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// defaultServiceAccount is the account pods run as unless they name another.
const defaultServiceAccount = "default"

// buildServiceAccountController builds the controller that keeps a "default" ServiceAccount in every active namespace, as Kubernetes'
// serviceaccount controller does: it creates it with the namespace, and again if it is deleted.
func buildServiceAccountController(ctx context.Context, c *Clients) (func(), error) {
	namespaces := c.Informers.Core().V1().Namespaces()
	accounts := c.Informers.Core().V1().ServiceAccounts()
	queue := newKeyQueue(queueConfig{what: "namespace", logger: c.Logger.Named("serviceaccount"),
		sync: func(ctx context.Context, namespace string) (time.Duration, error) {
			return 0, ensureDefaultServiceAccount(ctx, c, namespace)
		}})
	namespaces.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { queue.add(obj.(*corev1.Namespace).Name) },
		UpdateFunc: func(_, obj any) { queue.add(obj.(*corev1.Namespace).Name) },
	})
	accounts.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if sa, ok := obj.(*corev1.ServiceAccount); ok && sa.Name == defaultServiceAccount {
				queue.add(sa.Namespace)
			}
		},
	})
	return func() { queue.run(ctx, c, namespaces.Informer().HasSynced, accounts.Informer().HasSynced) }, nil
}

func ensureDefaultServiceAccount(ctx context.Context, c *Clients, namespace string) error {
	ns, err := c.Informers.Core().V1().Namespaces().Lister().Get(namespace)
	if apierrors.IsNotFound(err) || (err == nil && ns.Status.Phase == corev1.NamespaceTerminating) {
		return nil // gone or going: nothing to add
	}
	if err != nil {
		return err
	}
	if _, err := c.Informers.Core().V1().ServiceAccounts().Lister().ServiceAccounts(namespace).Get(defaultServiceAccount); err == nil {
		return nil
	}
	_, err = c.Kube.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: defaultServiceAccount},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) || apierrors.IsForbidden(err) { // forbidden: the namespace began terminating
		return nil
	}
	return err
}
