"""Which Arrow column types the loader supports, and how each becomes a NumPy array.

Worker side: pyarrow and NumPy only, never pyspark.

* numbers and booleans -> 1-D arrays (one value per row);
* fixed-length arrays of numbers (Spark ``ArrayType``) -> 2-D arrays ``(rows, length)``;
* Spark ML vectors (``VectorUDT``, stored as ``struct<type, size, indices, values>``), dense or
  sparse -> dense 2-D arrays ``(rows, size)``;
* binary and strings -> object arrays (lists of ``bytes`` / ``str`` in batches), for the user's
  ``transform``; these may hold nulls (``None``).
"""

from __future__ import annotations

import enum

import numpy as np
import pyarrow as pa

from sparktrain.errors import ConfigurationError

# Field names of the struct Spark writes for pyspark.ml.linalg.VectorUDT (and mllib's).
VECTOR_FIELDS = ("type", "size", "indices", "values")
_SPARSE, _DENSE = 0, 1

FLOAT_DTYPES = ("float16", "float32", "float64")


class ColumnKind(enum.Enum):
    """How a column turns into batch values."""

    SCALAR = "scalar"
    ARRAY = "array"
    VECTOR = "vector"
    BINARY = "binary"


def _is_number(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_boolean(data_type)
    )


def _is_list(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(data_type)
        or pa.types.is_large_list(data_type)
        or pa.types.is_fixed_size_list(data_type)
    )


def is_vector_type(data_type: pa.DataType) -> bool:
    """Whether an Arrow type is the struct Spark writes for an ML vector."""
    if not pa.types.is_struct(data_type):
        return False
    names = tuple(data_type.field(i).name for i in range(data_type.num_fields))
    return sorted(names) == sorted(VECTOR_FIELDS)


def column_kind(field: pa.Field) -> ColumnKind:
    """Classify a column, or raise naming the column, its type and the fix.

    Raises:
        ConfigurationError: the type cannot become a tensor or a list.
    """
    data_type = field.type
    if _is_number(data_type):
        return ColumnKind.SCALAR
    if _is_list(data_type) and _is_number(data_type.value_type):
        return ColumnKind.ARRAY
    if is_vector_type(data_type):
        return ColumnKind.VECTOR
    if (
        pa.types.is_binary(data_type)
        or pa.types.is_large_binary(data_type)
        or pa.types.is_fixed_size_binary(data_type)
        or pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
    ):
        return ColumnKind.BINARY
    raise unsupported_type_error(field.name, str(data_type))


def unsupported_type_error(name: str, type_name: str) -> ConfigurationError:
    """The error for a column whose type cannot become a tensor, naming it and the fix."""
    return ConfigurationError(
        f"column {name!r} has type {type_name}, which the data loader cannot turn into a "
        f"tensor. Supported: numbers and booleans, fixed-length arrays of numbers, Spark ML "
        f"vectors, binary and strings (passed as lists to your transform). Drop or cast the "
        f"column before converting (e.g. df.drop({name!r}), or cast decimals to double and "
        f"timestamps to long), or leave it out with columns=[...]"
    )


def null_error(name: str, what: str = "null values") -> ConfigurationError:
    """The error for nulls in a feature column, naming the column and the fix."""
    return ConfigurationError(
        f"column {name!r} has {what}; a feature column needs a value in every row. Drop those "
        f"rows (df.dropna(subset=[{name!r}])) or fill them (df.fillna(...)) before "
        f"converting, or leave the column out with columns=[...]"
    )


def _single(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        return array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return array


def _cast(values: np.ndarray, dtype: str | None) -> np.ndarray:
    if dtype is not None and np.issubdtype(values.dtype, np.floating):
        return values.astype(dtype, copy=False)
    return values


def to_numpy(
    name: str, kind: ColumnKind, array: pa.Array | pa.ChunkedArray, dtype: str | None = None
) -> np.ndarray:
    """Convert one column of a block of rows to a NumPy array (see the module docstring).

    Args:
        name: column name, for error messages.
        kind: the column's :func:`column_kind`.
        array: the column's values.
        dtype: float dtype for floating-point columns and vectors (``None``: keep; vectors
            then become ``float64``).

    Returns:
        A 1-D array for scalars and binary/strings (object dtype), 2-D for arrays and vectors.
        Arrays that view Arrow memory may be read-only.

    Raises:
        ConfigurationError: nulls in a numeric column, arrays of different lengths, or vector
            sizes that differ.
    """
    array = _single(array)
    if kind is ColumnKind.BINARY:
        return np.asarray(array.to_numpy(zero_copy_only=False), dtype=object)
    if array.null_count:
        raise null_error(name)
    if kind is ColumnKind.SCALAR:
        return _cast(array.to_numpy(zero_copy_only=False), dtype)
    if kind is ColumnKind.ARRAY:
        return _cast(_array_to_numpy(name, array), dtype)
    return _vector_to_numpy(name, array, dtype or "float64")


def _array_to_numpy(name: str, array: pa.Array) -> np.ndarray:
    rows = len(array)
    flat = array.flatten()
    if flat.null_count:
        raise null_error(name, "null elements inside its arrays")
    if pa.types.is_fixed_size_list(array.type):
        width = array.type.list_size
    else:
        lengths = array.value_lengths().to_numpy(zero_copy_only=False)
        width = int(lengths[0]) if rows else 0
        if rows and (lengths != width).any():
            raise ConfigurationError(
                f"column {name!r} holds arrays of different lengths ({int(lengths.min())} to "
                f"{int(lengths.max())}); the loader needs one length per column to make a 2-D "
                f"tensor. Pad or truncate the arrays before converting, or leave the column "
                f"out with columns=[...]"
            )
    return flat.to_numpy(zero_copy_only=False).reshape(rows, width)


def _vector_to_numpy(name: str, array: pa.Array, dtype: str) -> np.ndarray:
    """Dense ``(rows, size)`` array from Spark's vector struct; sparse vectors are densified."""
    rows = len(array)
    fields = dict(
        zip(
            [array.type.field(i).name for i in range(array.type.num_fields)],
            array.flatten(),
            strict=True,
        )
    )
    kinds = fields["type"].to_numpy(zero_copy_only=False)
    values = fields["values"]
    if values.null_count or values.flatten().null_count:
        raise null_error(name, "vectors without values")
    lengths = values.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    flat = values.flatten().to_numpy(zero_copy_only=False)
    dense = kinds == _DENSE
    if dense.all():
        width = int(lengths[0]) if rows else 0
        if rows and (lengths != width).any():
            raise _vector_size_error(name, lengths)
        return flat.reshape(rows, width).astype(dtype, copy=False)
    sizes = fields["size"].fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    widths = np.where(dense, lengths, sizes)
    width = int(widths[0])
    if (widths != width).any() or width < 0:
        raise _vector_size_error(name, widths)
    out = np.zeros((rows, width), dtype=dtype)
    row_of_value = np.repeat(np.arange(rows), lengths)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    indices = fields["indices"].flatten().to_numpy(zero_copy_only=False)
    sparse_values = np.repeat(~dense, lengths)
    if len(indices) != int(sparse_values.sum()) or (len(indices) and indices.max() >= width):
        raise ConfigurationError(
            f"column {name!r} holds malformed sparse vectors (indices do not match values or "
            f"exceed the size {width}); rebuild them with pyspark.ml.linalg.Vectors.sparse"
        )
    cols[sparse_values] = indices
    out[row_of_value, cols] = flat
    return out


def _vector_size_error(name: str, sizes: np.ndarray) -> ConfigurationError:
    return ConfigurationError(
        f"column {name!r} holds vectors of different sizes ({int(sizes.min())} to "
        f"{int(sizes.max())}); the loader needs one size per column to make a 2-D tensor. "
        f"Make every vector the same size before converting, or leave the column out with "
        f"columns=[...]"
    )
