package apiserver

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kubernetes/pkg/printers"
	printersinternal "k8s.io/kubernetes/pkg/printers/internalversion"
	printerstorage "k8s.io/kubernetes/pkg/printers/storage"
)

// kubePrinters are kube-apiserver's own table printers (the columns `kubectl get` shows), which take kube's
// internal types.
var kubePrinters = printerstorage.TableConvertor{TableGenerator: printers.NewTableGenerator().With(printersinternal.AddHandlers)}

// kubeTableConvertor renders a kind that runs kube's strategies with kube's printers: each v1 object is
// converted to its internal type (as for the strategies, kubestrategy.go), printed, and its row carries the
// v1 object again, which is what the response encodes.
type kubeTableConvertor struct {
	internal func() runtime.Object
}

func (c kubeTableConvertor) ConvertToTable(ctx context.Context, object runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	if !meta.IsListType(object) {
		in := c.internal()
		if err := kubeScheme.Convert(object, in, nil); err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		table, err := kubePrinters.ConvertToTable(ctx, in, tableOptions)
		if err != nil {
			return nil, err
		}
		for i := range table.Rows {
			table.Rows[i].Object.Object = object
		}
		return table, nil
	}
	items, err := meta.ExtractList(object)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	gvks, _, err := kubeScheme.ObjectKinds(c.internal())
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	list, err := kubeScheme.New(gvks[0].GroupVersion().WithKind(gvks[0].Kind + "List"))
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	internalItems := make([]runtime.Object, len(items))
	for i, item := range items {
		internalItems[i] = c.internal()
		if err := kubeScheme.Convert(item, internalItems[i], nil); err != nil {
			return nil, apierrors.NewInternalError(err)
		}
	}
	if err := meta.SetList(list, internalItems); err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	// The printers' rows point at the internal list's items: map each back to its v1 object.
	printed, err := meta.ExtractList(list)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	v1Of := make(map[runtime.Object]runtime.Object, len(items))
	for i := range printed {
		v1Of[printed[i]] = items[i]
	}
	table, err := kubePrinters.ConvertToTable(ctx, list, tableOptions)
	if err != nil {
		return nil, err
	}
	for i := range table.Rows {
		v1, ok := v1Of[table.Rows[i].Object.Object]
		if !ok {
			return nil, apierrors.NewInternalError(fmt.Errorf("a table row of %T matches no listed object", list))
		}
		table.Rows[i].Object.Object = v1
	}
	if l, err := meta.ListAccessor(object); err == nil {
		table.ResourceVersion, table.Continue, table.RemainingItemCount = l.GetResourceVersion(), l.GetContinue(), l.GetRemainingItemCount()
	}
	return table, nil
}
