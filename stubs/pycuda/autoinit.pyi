from pycuda.driver import Context, Device

device: Device
context: Context
