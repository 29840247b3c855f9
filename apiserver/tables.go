package apiserver

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
)

// column is one column of a kind's table, as kubectl prints it. Priority 1 columns appear with -o wide.
type column struct {
	name     string
	typ      string // "string" or "integer"
	priority int32
	value    func(obj runtime.Object) interface{}
}

// tableConvertor renders a kind's objects as a metav1.Table: NAME, the kind's columns, and AGE unless the
// kind places it itself.
type tableConvertor struct {
	columns []column
}

var nameColumn = column{name: "Name", typ: "string", value: func(obj runtime.Object) interface{} {
	m, _ := meta.Accessor(obj)
	return m.GetName()
}}

var ageColumn = column{name: "Age", typ: "string", value: func(obj runtime.Object) interface{} {
	m, _ := meta.Accessor(obj)
	return age(m.GetCreationTimestamp())
}}

// age formats a timestamp as kubectl does ("5m", "3d").
func age(t metav1.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(time.Since(t.Time))
}

func (c tableConvertor) ConvertToTable(ctx context.Context, object runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	table := &metav1.Table{}
	opts, _ := tableOptions.(*metav1.TableOptions)
	noHeaders := opts != nil && opts.NoHeaders
	if !noHeaders {
		for _, col := range c.columns {
			table.ColumnDefinitions = append(table.ColumnDefinitions, metav1.TableColumnDefinition{
				Name: col.name, Type: col.typ, Priority: col.priority, Format: formatOf(col.name),
			})
		}
	}
	add := func(obj runtime.Object) {
		row := metav1.TableRow{Object: runtime.RawExtension{Object: obj}}
		for _, col := range c.columns {
			row.Cells = append(row.Cells, col.value(obj))
		}
		table.Rows = append(table.Rows, row)
	}
	if meta.IsListType(object) {
		items, err := meta.ExtractList(object)
		if err != nil {
			return nil, err
		}
		for _, item := range items {
			add(item)
		}
		if l, err := meta.ListAccessor(object); err == nil {
			table.ResourceVersion = l.GetResourceVersion()
			table.Continue = l.GetContinue()
			table.RemainingItemCount = l.GetRemainingItemCount()
		}
		return table, nil
	}
	if _, err := meta.Accessor(object); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("cannot render %T as a table", object))
	}
	add(object)
	if m, err := meta.Accessor(object); err == nil {
		table.ResourceVersion = m.GetResourceVersion()
	}
	return table, nil
}

func formatOf(name string) string {
	if name == "Name" {
		return "name"
	}
	return ""
}
