package apiserver

import (
	"context"
	"strconv"
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
// Skiff serves the configuration but does not classify requests by it: the in-flight limits
// (max_requests_in_flight, max_mutating_requests_in_flight) bound what the servers take at once, as
// kube-apiserver's --enable-priority-and-fairness=false does.

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

// flowSchemaColumns are `kubectl get flowschemas`' columns.
var flowSchemaColumns = []column{nameColumn,
	{name: "PriorityLevel", typ: "string", value: func(o runtime.Object) any {
		return o.(*flowcontrolv1.FlowSchema).Spec.PriorityLevelConfiguration.Name
	}},
	{name: "MatchingPrecedence", typ: "integer", value: func(o runtime.Object) any {
		return int64(o.(*flowcontrolv1.FlowSchema).Spec.MatchingPrecedence)
	}},
	{name: "DistinguisherMethod", typ: "string", value: func(o runtime.Object) any {
		if m := o.(*flowcontrolv1.FlowSchema).Spec.DistinguisherMethod; m != nil {
			return string(m.Type)
		}
		return "<none>"
	}},
	ageColumn,
	{name: "MissingPL", typ: "string", value: func(o runtime.Object) any {
		for _, c := range o.(*flowcontrolv1.FlowSchema).Status.Conditions {
			if c.Type == flowcontrolv1.FlowSchemaConditionDangling {
				return string(c.Status)
			}
		}
		return "?"
	}},
}

// priorityLevelColumns are `kubectl get prioritylevelconfigurations`' columns.
var priorityLevelColumns = []column{nameColumn,
	{name: "Type", typ: "string", value: func(o runtime.Object) any {
		return string(o.(*flowcontrolv1.PriorityLevelConfiguration).Spec.Type)
	}},
	{name: "NominalConcurrencyShares", typ: "string", value: func(o runtime.Object) any {
		if l := o.(*flowcontrolv1.PriorityLevelConfiguration).Spec.Limited; l != nil && l.NominalConcurrencyShares != nil {
			return strconv.FormatInt(int64(*l.NominalConcurrencyShares), 10)
		}
		return "<none>"
	}},
	{name: "Queues", typ: "string", value: func(o runtime.Object) any {
		if l := o.(*flowcontrolv1.PriorityLevelConfiguration).Spec.Limited; l != nil && l.LimitResponse.Queuing != nil {
			return strconv.FormatInt(int64(l.LimitResponse.Queuing.Queues), 10)
		}
		return "<none>"
	}},
	{name: "HandSize", typ: "string", value: func(o runtime.Object) any {
		if l := o.(*flowcontrolv1.PriorityLevelConfiguration).Spec.Limited; l != nil && l.LimitResponse.Queuing != nil {
			return strconv.FormatInt(int64(l.LimitResponse.Queuing.HandSize), 10)
		}
		return "<none>"
	}},
	{name: "QueueLengthLimit", typ: "string", value: func(o runtime.Object) any {
		if l := o.(*flowcontrolv1.PriorityLevelConfiguration).Spec.Limited; l != nil && l.LimitResponse.Queuing != nil {
			return strconv.FormatInt(int64(l.LimitResponse.Queuing.QueueLengthLimit), 10)
		}
		return "<none>"
	}},
	ageColumn,
}

// flowControlBootstrapHook keeps the bootstrap configuration, as kube-apiserver's
// priority-and-fairness-config-producer hook does: once at start (retried each second), then every minute,
// and, sooner than kube-apiserver, at once when a FlowSchema or PriorityLevelConfiguration is deleted.
// Every server runs it; the ensurer's creates and updates are conditional, so servers do not undo each other.
// Unlike kube's hook it never fails: a failed post-start hook ends the process, and a server may stop before
// its informers sync.
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
	return func(hook genericapiserver.PostStartHookContext) error {
		for _, inf := range []cache.SharedIndexInformer{schemas.Informer(), levels.Informer()} {
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
