package apiserver

import (
	"context"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	flowcontrolbootstrap "k8s.io/apiserver/pkg/apis/flowcontrol/bootstrap"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/informers"
	flowcontrolclient "k8s.io/client-go/kubernetes/typed/flowcontrol/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/apis/flowcontrol"
	kubeflowcontrolv1 "k8s.io/kubernetes/pkg/apis/flowcontrol/v1"
	"k8s.io/kubernetes/pkg/registry/flowcontrol/ensurer"
	"k8s.io/kubernetes/pkg/registry/flowcontrol/flowschema"
	"k8s.io/kubernetes/pkg/registry/flowcontrol/prioritylevelconfiguration"
)

// API Priority and Fairness' configuration, flowcontrol.apiserver.k8s.io/v1: FlowSchemas and
// PriorityLevelConfigurations with kube's registry strategies and validation (status only through /status),
// and the bootstrap configuration every kube-apiserver keeps: the mandatory objects (exempt, catch-all)
// restored as they were, the suggested ones created and kept up to date unless a user set their
// apf.kubernetes.io/autoupdate-spec annotation to false, and objects of an older bootstrap removed.
//
// The servers classify and queue requests by it (server.go sets the library's APF filter), with the two
// in-flight limits together as the concurrency the priority levels share, as kube-apiserver does.

func init() {
	utilruntime.Must(flowcontrol.AddToScheme(kubeScheme))
	utilruntime.Must(kubeflowcontrolv1.AddToScheme(kubeScheme))
}

var (
	flowSchemaStrategies = &kubeStrategies{
		internal:     func() runtime.Object { return &flowcontrol.FlowSchema{} },
		main:         flowschema.Strategy,
		subresources: map[string]kubeStrategy{"status": flowschema.StatusStrategy},
	}
	priorityLevelStrategies = &kubeStrategies{
		internal:     func() runtime.Object { return &flowcontrol.PriorityLevelConfiguration{} },
		main:         prioritylevelconfiguration.Strategy,
		subresources: map[string]kubeStrategy{"status": prioritylevelconfiguration.StatusStrategy},
	}
)

// flowControlBootstrapHook keeps the bootstrap configuration, as kube-apiserver's
// priority-and-fairness-config-producer hook does: once at start (retried each second), then every minute,
// and, sooner than kube-apiserver, at once when a FlowSchema or PriorityLevelConfiguration is deleted.
// Every server runs it; the ensurer's creates and updates are conditional, so servers do not undo each other.
// Unlike kube's hook it does not wait for the informers or the first round before returning: a failed
// post-start hook ends the process, and a server may stop before its informers sync.
func flowControlBootstrapHook(factory informers.SharedInformerFactory) genericapiserver.PostStartHookFunc {
	schemas := factory.Flowcontrol().V1().FlowSchemas()
	levels := factory.Flowcontrol().V1().PriorityLevelConfigurations()
	deleted := make(chan struct{}, 1)
	onDelete := cache.ResourceEventHandlerFuncs{DeleteFunc: func(any) {
		select {
		case deleted <- struct{}{}:
		default:
		}
	}}
	// The informers are asked for now, before the server starts its factory: post-start hooks run
	// concurrently, and an informer first asked for after the factory started would never start.
	watched := []cache.SharedIndexInformer{schemas.Informer(), levels.Informer()}
	return func(hook genericapiserver.PostStartHookContext) error {
		for _, inf := range watched {
			if _, err := inf.AddEventHandler(onDelete); err != nil {
				return err
			}
		}
		cfg := rest.CopyConfig(hook.LoopbackClientConfig)
		cfg.Timeout = 10 * time.Second
		client, err := flowcontrolclient.NewForConfig(cfg)
		if err != nil {
			return err
		}
		go func() {
			if !cache.WaitForCacheSync(hook.Done(), schemas.Informer().HasSynced, levels.Informer().HasSynced) {
				return
			}
			fsOps := ensurer.NewFlowSchemaOps(client.FlowSchemas(), schemas.Lister())
			plOps := ensurer.NewPriorityLevelConfigurationOps(client.PriorityLevelConfigurations(), levels.Lister())
			pause := time.Second
			for {
				if err := ensureFlowControlBootstrap(hook, fsOps, plOps); err != nil {
					klog.InfoS("keeping the API Priority and Fairness bootstrap configuration", "err", err)
				} else {
					pause = time.Minute
				}
				select {
				case <-hook.Done():
					return
				case <-time.After(pause):
				case <-deleted:
				}
			}
		}()
		return nil
	}
}

// ensureFlowControlBootstrap is one round of kube-apiserver's ensurer: suggested, then mandatory, then what
// an older bootstrap left.
func ensureFlowControlBootstrap(ctx context.Context, fsOps ensurer.ObjectOps[*flowcontrolv1.FlowSchema],
	plOps ensurer.ObjectOps[*flowcontrolv1.PriorityLevelConfiguration]) error {
	if err := ensurer.EnsureConfigurations(ctx, plOps, flowcontrolbootstrap.SuggestedPriorityLevelConfigurations,
		ensurer.NewSuggestedEnsureStrategy[*flowcontrolv1.PriorityLevelConfiguration]()); err != nil {
		return err
	}
	if err := ensurer.EnsureConfigurations(ctx, fsOps, flowcontrolbootstrap.SuggestedFlowSchemas,
		ensurer.NewSuggestedEnsureStrategy[*flowcontrolv1.FlowSchema]()); err != nil {
		return err
	}
	if err := ensurer.EnsureConfigurations(ctx, plOps, flowcontrolbootstrap.MandatoryPriorityLevelConfigurations,
		ensurer.NewMandatoryEnsureStrategy[*flowcontrolv1.PriorityLevelConfiguration]()); err != nil {
		return err
	}
	if err := ensurer.EnsureConfigurations(ctx, fsOps, flowcontrolbootstrap.MandatoryFlowSchemas,
		ensurer.NewMandatoryEnsureStrategy[*flowcontrolv1.FlowSchema]()); err != nil {
		return err
	}
	if err := ensurer.RemoveUnwantedObjects(ctx, fsOps,
		append(append([]*flowcontrolv1.FlowSchema{}, flowcontrolbootstrap.MandatoryFlowSchemas...), flowcontrolbootstrap.SuggestedFlowSchemas...)); err != nil {
		return err
	}
	return ensurer.RemoveUnwantedObjects(ctx, plOps,
		append(append([]*flowcontrolv1.PriorityLevelConfiguration{}, flowcontrolbootstrap.MandatoryPriorityLevelConfigurations...),
			flowcontrolbootstrap.SuggestedPriorityLevelConfigurations...))
}
